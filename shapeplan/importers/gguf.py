"""GGUF (llama.cpp) file -> LlamaConfig + Hugging Face-named weights -> shapeplan Graph.

``sp.load("model.gguf")`` calls ``load_gguf``; ``GenerationPipeline.from_pretrained("model.gguf")``
calls ``read_gguf`` and builds the same decoder as for a Hugging Face directory. Parsing is the
``gguf`` package's ``GGUFReader`` (a memory map: nothing is read until a tensor is used). F32 / F16 /
BF16 tensors become tensors of the model dtype; quantized matrices stay packed in their GGUF blocks
(``shapeplan.quant.QuantWeight``: the file's bytes, moved to the device as they are) and the decoder
reads them with ``shapeplan::QuantMatMul`` / ``QuantGather`` (shapeplan/ops/quantized.py). A type the
kernels do not run is a ``QuantTypeError`` naming the tensor and the type.

On a device other than the CPU the packed matrices are copied into **one** uint8 buffer (``_arena``):
each starts at a 256-byte boundary, except that the members of a group the decoder stacks (q/k/v,
gate/up; ``weights.fused_groups``) of one type follow each other with no gap (in a group of mixed types,
such as Q4_K_M's q/k in Q4_K and v in Q6_K, those of each type), so the builder finds them stacked
already and copies nothing. One allocation instead of ~7 per layer: the device memory is the
tensor bytes plus at most 255 bytes per matrix, where separate allocations each rounded up in the
caching allocator (up to ~1 MB apiece: llama-1b Q8_0 measured + 4.4-5.6 % over its file's tensor bytes
with them, + 0.0 % with the arena, as 1b and 8b Q4_K_M; H200, 2026-12-02). On the CPU the packed bytes
stay views of the file's memory map.

With ``SHAPEPLAN_QUANT_REPACK`` (on by default; faster on the H200 end to end: docs/llm.md) each Q4_K,
Q6_K and Q8_0 matrix is rewritten in the arena, on the device, as ``Q4_K_R`` / ``Q6_K_R`` / ``Q8_0_R``
(the same bytes, each row's codes first: shapeplan/quant/formats.py); the arena's grouping is by the
file's types, so a stacked group stays stacked.

Two things differ from a Hugging Face checkpoint:

- llama.cpp's converter interleaves the rows of ``attn_q`` / ``attn_k`` for its rotary layout
  (``convert_hf_to_gguf.LlamaModel.permute``: per head, ``[2, D/2]`` rows -> ``[D/2, 2]``); we undo
  it, so the weights are the Hugging Face ones again and RotaryEmbedding (half-split) applies.
- Llama 3 rope scaling is stored as a ``rope_freqs.weight`` tensor of per-frequency divisors; it
  becomes ``rope_scaling={"rope_type": "freq_factors", "factors": [...]}`` (see config.inv_freq).

Architectures: ``llama`` (Llama 1-3, Mistral, TinyLlama, ...), ``qwen2`` (Qwen2 / Qwen2.5: q/k/v biases,
``blk.N.attn_q.bias``), ``qwen3`` (an RMSNorm on each head's q and k, ``blk.N.attn_q_norm.weight``) and ``phi3``
(q/k/v stacked in ``attn_qkv``, gate/up in ``ffn_up``: ``gguf_tensors``; the parts are row views). llama.cpp
permutes q/k rows for the ``llama`` architecture only (its others use the rotate-half ("NEOX") rotary
layout, Hugging Face's own), so only those rows are un-permuted.

The tokenizer, when the file holds one, is rebuilt as a ``tokenizers`` BPE (``read_tokenizer``):
``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: Llama 3, Qwen) from ``tokenizer.ggml.tokens`` / ``merges``
with the split rules ``tokenizer.ggml.pre`` names; ``"llama"`` (SentencePiece: Llama 1/2, Mistral, TinyLlama)
as a byte-fallback BPE whose merges are the file's, or, where it has none (files converted from a
``tokenizer.model``), made from ``tokenizer.ggml.scores`` (a piece's score orders the merges that make it).
Other kinds (``t5``, ``bert``, ...) are not converted: pass ``tokenizer=<Hugging Face directory>``.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from shapeplan.errors import ModelError
from shapeplan.ir.dtypes import dtype_name
from shapeplan.ir.graph import Graph
from shapeplan.llm.config import LlamaConfig
from shapeplan.llm.weights import FUSED, expected_shapes, fused_groups
from shapeplan.quant.formats import QTYPES, REPACK_OF, QuantTypeError, QuantWeight, repack

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3")

# GGUF name (per layer: without the "blk.N." prefix) -> Hugging Face name
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
          "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
          "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
          "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
          "ffn_down.weight": "mlp.down_proj.weight",
          # qwen2's q/k/v biases, qwen3's q/k norms (expected_shapes asks for them where the config has them)
          "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.bias": "self_attn.v_proj.bias",
          "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}
_FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
#: per architecture, the layer tensors a GGUF file holds stacked by rows: GGUF name -> the Hugging Face fused
#: tensor it is (its parts: weights.FUSED, the one list of them)
_FUSED = {"phi3": {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}}


def _reader_class() -> type:
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    class _Reader(gguf.GGUFReader):
        """GGUFReader whose tensor table is bounds-checked first, so a truncated file names the
        tensor that lies past its end (the stock reader fails inside numpy with no name)."""

        path = "<gguf>"

        def _build_tensors(self, start_offs: int, fields: list) -> None:
            size = len(self.data)
            for f in fields:
                _, name_data, _, dims, raw, offset = f.parts
                name = bytes(name_data).decode("utf-8", "replace")
                try:
                    qt = GGMLQuantizationType(int(raw[0]))
                except ValueError:
                    raise ModelError(f"{self.path}: tensor {name!r} has unknown ggml type id {int(raw[0])} "
                                     "(corrupt file, or a quant type newer than the gguf package)") from None
                block, type_size = GGML_QUANT_SIZES[qt]
                n = int(np.prod(dims.astype(np.int64)))
                if n % block:
                    raise ModelError(f"{self.path}: tensor {name!r} ({qt.name}) has {n} elements, "
                                     f"not a multiple of the block size {block} (corrupt tensor info)")
                end = start_offs + int(offset[0]) + n // block * type_size
                if end > size:
                    raise ModelError(f"{self.path}: tensor {name!r} ends at byte {end} but the file has "
                                     f"{size} bytes (truncated file)")
            super()._build_tensors(start_offs, fields)

    return _Reader


class GGUFFile:
    """One memory-mapped GGUF file: metadata fields and tensors by name."""

    def __init__(self, path: str) -> None:
        self.path = path
        if not os.path.isfile(path):
            raise ModelError(f"{path}: no such GGUF file")
        cls = _reader_class()
        try:
            cls.path = path
            self._r = cls(path, mode="c")       # copy-on-write map: tensors may view it writably
        except ModelError:
            raise
        except Exception as e:                  # the reader raises ValueError / IndexError / ... on bad bytes
            raise ModelError(f"{path}: not a readable GGUF file (truncated or corrupt header): "
                             f"{type(e).__name__}: {e}") from None
        self.tensors = {t.name: t for t in self._r.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        f = self._r.get_field(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception as e:
            raise ModelError(f"{self.path}: metadata field {key!r} is corrupt: {e}") from None

    def require(self, key: str) -> Any:
        v = self.get(key)
        if v is None:
            raise ModelError(f"{self.path}: required metadata field {key!r} is missing")
        return v

    def shape(self, name: str) -> tuple[int, ...]:
        """Row-major shape (GGUF stores dims innermost first)."""
        return tuple(int(x) for x in reversed(self.tensors[name].shape.tolist()))

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def weight(self, name: str, dtype: torch.dtype) -> torch.Tensor | QuantWeight:
        """The tensor ``name``: F32 / F16 / BF16 as a ``dtype`` tensor (``tensor``), a type the quantized
        kernels run as a QuantWeight viewing the map (nothing copied)."""
        qt = self.tensors[name].tensor_type.name
        if qt in _FLOAT_DTYPES:
            return self.tensor(name, dtype)
        q = QTYPES.get(qt)
        if q is None or q.ggml_id is None or len(self.shape(name)) != 2:
            ok = ["F32", "F16", "BF16"] + [n for n, t in QTYPES.items() if t.ggml_id is not None]
            raise QuantTypeError(f"{self.path}: tensor {name!r} has quant type {qt}, which "
                                 f"shapeplan's kernels do not run (supported: {', '.join(ok)})")
        rows, cols = self.shape(name)
        data = self.tensors[name].data.reshape(rows, q.row_bytes(cols))          # uint8 view of the map
        return QuantWeight(torch.from_numpy(data), qt, (rows, cols))

    def tensor(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The tensor ``name`` in ``dtype``. F32 / F16 in their own dtype stay views of the map."""
        from gguf.constants import GGMLQuantizationType as Q
        from gguf.quants import dequantize
        t, shape = self.tensors[name], self.shape(name)
        qt = t.tensor_type
        if qt in (Q.F32, Q.F16):
            out = torch.from_numpy(t.data).reshape(shape)
        elif qt == Q.BF16:                      # raw bytes: reinterpret, exact
            out = torch.from_numpy(t.data.view(np.int16)).view(torch.bfloat16).reshape(shape)
        else:
            try:
                arr = dequantize(t.data, qt)
            except NotImplementedError:
                from gguf.quants import _type_traits
                ok = ["F32", "F16"] + sorted(q.name for q in _type_traits)
                raise ModelError(f"{self.path}: tensor {name!r} has quant type {qt.name}, which cannot be "
                                 f"dequantized (supported: {', '.join(ok)})") from None
            out = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(shape)
        return out.to(dtype)


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: per head, rows ``[D/2, 2]`` (interleaved pairs) back to
    ``[2, D/2]`` (Hugging Face's rotate-half layout)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_config(f: GGUFFile) -> LlamaConfig:
    arch = f.require("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(f"{f.path}: architecture {arch!r} is not supported; supported GGUF architectures: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    a = arch + "."
    hidden, heads = int(f.require(a + "embedding_length")), int(f.require(a + "attention.head_count"))
    head_dim = int(f.get(a + "attention.key_length") or hidden // heads)
    rope_dims = int(f.get(a + "rope.dimension_count") or head_dim)
    if rope_dims != head_dim:
        raise ModelError(f"{f.path}: partial rotary ({a}rope.dimension_count={rope_dims} < head dim "
                         f"{head_dim}) is not supported")
    if "token_embd.weight" not in f.tensors:
        raise ModelError(f"{f.path}: tensor 'token_embd.weight' is missing")
    vocab = int(f.get(a + "vocab_size") or f.shape("token_embd.weight")[0])
    rope_scaling = None
    kind = f.get(a + "rope.scaling.type")
    if "rope_factors_long.weight" in f.tensors:
        raise ModelError(f"{f.path}: rope scaling 'longrope' (rope_factors_long / rope_factors_short: Phi-3.5, "
                         "Phi-4-mini) is not supported")
    if "rope_freqs.weight" in f.tensors:           # Llama 3: per-frequency divisors
        rope_scaling = {"rope_type": "freq_factors",
                        "factors": f.tensor("rope_freqs.weight", torch.float32).tolist()}
    elif kind == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(f.require(a + "rope.scaling.factor"))}
    elif kind not in (None, "none"):
        raise ModelError(f"{f.path}: rope scaling {kind!r} is not supported (supported: linear, "
                         "Llama 3 rope_freqs)")
    kv_heads = f.get(a + "attention.head_count_kv") or heads
    if isinstance(kv_heads, list):
        raise ModelError(f"{f.path}: per-layer {a}attention.head_count_kv is not supported")
    types = [f.type_name(n) for n in f.tensors if len(f.shape(n)) == 2]
    common = max(set(types), key=types.count) if types else "F32"
    eos = [int(e) for e in (f.get("tokenizer.ggml.eos_token_id"), f.get("tokenizer.ggml.eot_token_id"))
           if e is not None]
    return LlamaConfig(
        model_type=arch, vocab_size=vocab, hidden_size=hidden,
        intermediate_size=int(f.require(a + "feed_forward_length")),
        num_layers=int(f.require(a + "block_count")), num_heads=heads, num_kv_heads=int(kv_heads),
        head_dim=head_dim, rms_norm_eps=float(f.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(f.get(a + "rope.freq_base", 10000.0)), rope_scaling=rope_scaling,
        max_position_embeddings=int(f.get(a + "context_length", 4096)),
        tie_word_embeddings="output.weight" not in f.tensors,
        # qwen2 always has q/k/v biases (a file without them fails validation, naming the tensor); llama may
        attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in f.tensors, qk_norm=arch == "qwen3",
        sliding_window=int(f.get(a + "attention.sliding_window") or 0) if arch == "phi3" else 0,
        # a quantized file computes in float16, as llama.cpp does; override with dtype=
        dtype=_FLOAT_DTYPES.get(common, "float16"),
        bos_token_id=f.get("tokenizer.ggml.bos_token_id"), eos_token_ids=list(dict.fromkeys(eos)))


def gguf_names(cfg: LlamaConfig) -> dict[str, str]:
    """Hugging Face name -> GGUF name for every tensor ``cfg`` needs."""
    out = {hf: g for g, hf in _GLOBAL.items()}
    for i in range(cfg.num_layers):
        out.update({f"model.layers.{i}.{hf}": f"blk.{i}.{g}" for g, hf in _LAYER.items()})
    return out


def gguf_tensors(cfg: LlamaConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(GGUF name, the Hugging Face tensors it holds stacked by rows) for every tensor ``cfg`` needs, in
    ``expected_shapes`` order (a stacked one where its first part is): one part each, but Phi-3's ``attn_qkv``
    (q, k, v) and ``ffn_up`` (gate, up)."""
    names = gguf_names(cfg)
    stacked: dict[str, tuple[str, tuple[str, ...]]] = {}
    for i in range(cfg.num_layers):
        for g, fused in _FUSED.get(cfg.model_type, {}).items():
            full = tuple(f"model.layers.{i}.{p}" for p, _ in FUSED[cfg.model_type][fused])
            stacked.update({p: (f"blk.{i}.{g}", full) for p in full})
    out, seen = [], set()
    for hf in expected_shapes(cfg):
        g, parts = stacked.get(hf, (names[hf], (hf,)))
        if g not in seen:
            seen.add(g)
            out.append((g, parts))
    return out


def read_weights(f: GGUFFile, cfg: LlamaConfig, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Hugging Face name -> tensor (the llama architecture's Q/K rows un-permuted, a stacked tensor's parts
    views of its rows), all validated by name and shape first."""
    dtype = dtype or cfg.torch_dtype
    layout, shapes = gguf_tensors(cfg), expected_shapes(cfg)
    for g, parts in layout:
        shape = (sum(shapes[p][0] for p in parts), *shapes[parts[0]][1:]) if len(parts) > 1 else shapes[parts[0]]
        what = parts[0] if len(parts) == 1 else " + ".join(p.rsplit(".", 2)[-2] for p in parts)
        if g not in f.tensors:
            raise ModelError(f"{f.path}: tensor {g!r} (for {what}) is missing from the GGUF file")
        if f.shape(g) != shape:
            raise ModelError(f"{f.path}: tensor {g!r} has shape {list(f.shape(g))}, expected {list(shape)} "
                             "from the file's metadata")
    out: dict[str, torch.Tensor | QuantWeight] = {}
    permuted = cfg.model_type == "llama"               # llama.cpp interleaves q/k rows of this architecture only
    for g, parts in layout:
        t = f.weight(g, dtype)
        r0 = 0
        for hf in parts:
            n = shapes[hf][0]
            heads = 0 if not permuted else cfg.num_heads if hf.endswith("q_proj.weight") else cfg.num_kv_heads \
                if hf.endswith("k_proj.weight") else 0
            if isinstance(t, QuantWeight):          # rows are independent: un-permute / split the packed rows
                rows = t.packed[r0:r0 + n]
                out[hf] = QuantWeight(_unpermute(rows, heads).contiguous() if heads else rows, t.qtype,
                                      (n, t.shape[1]))
            else:
                rows = t[r0:r0 + n]
                out[hf] = (_unpermute(rows, heads) if heads else rows).to(device)
            r0 += n
    return device_layout(cfg, out, device)


def device_layout(cfg: LlamaConfig, weights: dict, device: str | torch.device) -> dict:
    """``weights`` (float tensors and ``QuantWeight`` s) as a GGUF load leaves them on ``device``: off the CPU the
    packed matrices in one arena, in our layouts where ``SHAPEPLAN_QUANT_REPACK`` is on (module doc); on the CPU
    as they are. ``shapeplan bench --quantize`` passes its in-memory quantization through it, so that it times
    what a loaded file runs."""
    if torch.device(device).type == "cpu":
        return weights
    quant = {hf: w for hf, w in weights.items() if isinstance(w, QuantWeight)}
    return {**weights, **_arena(quant, fused_groups(cfg), device)}


#: start of each packed matrix in the arena (bytes) that does not continue a stacked group
ARENA_ALIGN = 256


def _arena(quant: dict[str, QuantWeight], groups: list[list[str]], device: str | torch.device
           ) -> dict[str, QuantWeight]:
    """``quant``'s packed bytes copied into one device buffer (module doc): the members of a group of
    ``groups`` packed in one type (same row bytes) are laid out consecutively, row blocks of one stacked
    matrix (a group of mixed types: one such block per type, as the builder stacks it); every other
    matrix, and each block, starts at an ``ARENA_ALIGN`` boundary."""
    blocks = []
    for g in groups:                            # a mixed group (Q4_K_M's Q6_K v): one block per type, in order
        runs: dict[tuple, list[str]] = {}
        for n in g:
            if n in quant:
                runs.setdefault((quant[n].qtype, quant[n].packed.shape[1]), []).append(n)
        blocks += [run for run in runs.values() if len(run) > 1]
    grouped = {n for g in blocks for n in g}
    blocks += [[n] for n in quant if n not in grouped]
    offsets, end = {}, 0
    for block in blocks:                        # each block aligned, its members back to back
        end = -(-end // ARENA_ALIGN) * ARENA_ALIGN
        for n in block:
            offsets[n] = end
            end += quant[n].nbytes
    buf = torch.empty(end, dtype=torch.uint8, device=device)
    from shapeplan import env
    layouts = REPACK_OF if env.get("SHAPEPLAN_QUANT_REPACK") else {}
    out = {}
    for n, off in offsets.items():
        w = quant[n]
        dst = buf[off:off + w.nbytes].view(w.packed.shape)
        dst.copy_(w.packed)
        name = layouts.get(w.qtype, w.qtype)
        if name != w.qtype:                     # our layout, made on the device (one matrix's temporary)
            dst.copy_(repack(dst, name))
        out[n] = QuantWeight(dst, name, w.shape)
    return out


def read_tokenizer(f: GGUFFile) -> Any:
    """A ``shapeplan.llm.tokenizer.Tokenizer`` from ``tokenizer.ggml.*``, or None (with a warning)
    when the file has none or holds a kind we do not convert (module doc)."""
    model = f.get("tokenizer.ggml.model")
    if model is None:
        return None
    if model not in ("gpt2", "llama"):
        warnings.warn(f"{f.path}: tokenizer model {model!r} is not converted (only byte-level BPE, 'gpt2', and "
                      "SentencePiece, 'llama'); pass tokenizer=<Hugging Face directory>", stacklevel=3)
        return None
    from tokenizers import AddedToken

    from shapeplan.llm.tokenizer import Tokenizer
    tokens = f.require("tokenizer.ggml.tokens")
    types = f.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = f.get("tokenizer.ggml.merges")
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)) or len(types) != len(tokens):
        raise ModelError(f"{f.path}: tokenizer.ggml.tokens is not a list of strings with one "
                         "tokenizer.ggml.token_type each")
    try:                # (tokens or merges that are not strings fail here too)
        if model == "gpt2":
            tok = _byte_level_bpe(f, tokens, merges or [])
        else:
            tok = _sentencepiece_bpe(f, tokens, types, merges, f.get("general.architecture") == "phi3")
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception (e.g. a merge of an unknown token)
        raise ModelError(f"{f.path}: its tokenizer (tokenizer.ggml.*) cannot be built: {e}") from None
    # control (3) and user-defined (4) tokens match whole and are special when decoding
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])

    def name(key: str) -> str | None:
        i = f.get(key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    config = {"bos_token": name("tokenizer.ggml.bos_token_id"), "eos_token": name("tokenizer.ggml.eos_token_id"),
              "add_bos_token": bool(f.get("tokenizer.ggml.add_bos_token", True)),
              "chat_template": f.get("tokenizer.chat_template")}
    return Tokenizer.from_tokenizer(tok, config)


def _byte_level_bpe(f: GGUFFile, tokens: list[str], merges: list[str]) -> Any:
    """``tokenizer.ggml.model == "gpt2"``: a byte-level BPE, text split by the rules ``tokenizer.ggml.pre``
    names (``_SPLITS``; GPT-2's for ``default`` and for a name we do not know, with a warning)."""
    from tokenizers import Regex
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    tok = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ", 1)) for m in merges]))
    pre = f.get("tokenizer.ggml.pre", "default")
    split = _SPLITS.get(pre)
    if split is not None:                          # the split regex, then bytes -> unicode
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        if pre not in ("default", "gpt2", "gpt-2"):
            warnings.warn(f"{f.path}: tokenizer.ggml.pre {pre!r} is not known; using GPT-2's split rules",
                          stacklevel=4)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(f: GGUFFile, tokens: list[str], types: list[int], merges: list[str] | None,
                       every_piece: bool = False) -> Any:
    """``tokenizer.ggml.model == "llama"``: a SentencePiece BPE vocabulary as a ``tokenizers`` BPE with byte fallback
    (a character outside the vocabulary becomes its UTF-8 bytes' ``<0xNN>`` tokens). Spaces are ``▁``, and one is
    put before the text when ``tokenizer.ggml.add_space_prefix`` (default true) says so; as transformers' Llama
    tokenizer does, only before the first piece of text, where llama.cpp also puts one after each special token the
    text spells out; ``every_piece`` (Phi-3, as its own tokenizer and transformers do) puts it before every piece
    of text, also one that starts with a space. The merges are the file's, or where it has none (a file converted
    from a ``tokenizer.model``) every split of a piece into two pieces of the vocabulary, ordered by the piece's
    score (``tokenizer.ggml.scores``: SentencePiece merges the pair whose piece scores highest), then by the longer
    left part, then the longer right part, then vocabulary order; ``transformers`` orders them the same way."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    if merges:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        scores = f.get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != len(tokens):
            raise ModelError(f"{f.path}: a SentencePiece vocabulary without tokenizer.ggml.merges needs "
                             f"tokenizer.ggml.scores, one per token ({len(tokens)}); got "
                             f"{len(scores) if isinstance(scores, list) else type(scores).__name__}")
        pairs = _merges_from_scores(tokens, [float(x) for x in scores], set(
            t for t, ty in zip(tokens, types) if ty != 1))
    unk = next((t for t, ty in zip(tokens, types) if ty == 2), None)
    tok = HFTokenizer(models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))
    if every_piece:
        tok.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if prefix else []) +
                                              [normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", split=False,
                                                     prepend_scheme="first" if prefix else "never")
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _merges_from_scores(tokens: list[str], scores: list[float], skip: set[str]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's scores (``_sentencepiece_bpe``): for each piece, every split into
    two pieces of the vocabulary; pieces in ``skip`` (control, byte, unknown, unused tokens) take no part."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []                                     # (sort key, left, right)
    for t, score in zip(tokens, scores):
        if t in skip or len(t) < 2:
            continue
        for i in range(1, len(t)):
            left, right = t[:i], t[i:]
            if left in ids and right in ids and left not in skip and right not in skip:
                found.append(((-score, -len(left), -len(right), ids[t], ids[left], ids[right]), left, right))
    found.sort(key=lambda x: x[0])
    return [(left, right) for _, left, right in found]


_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's: Llama 3's with one digit per piece
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# Mistral's Tekken (Mistral Nemo, Mistral Small 3): words split at case changes, one digit per piece
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: tokenizer.ggml.pre -> the regex that splits text before byte-level BPE (llama.cpp's names)
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
           "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
           "tekken": _TEKKEN_SPLIT}


def read_gguf(path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              tokenizer: Any = None) -> tuple[LlamaConfig, dict[str, torch.Tensor], Any]:
    """(config, weights, tokenizer) of a GGUF file. ``tokenizer``: a Hugging Face directory or a
    Tokenizer, used instead of the file's own."""
    f = GGUFFile(path)
    cfg = read_config(f)
    if dtype is not None:
        cfg.dtype = dtype_name(dtype)
    weights = read_weights(f, cfg, device=device, dtype=cfg.torch_dtype)
    if isinstance(tokenizer, (str, os.PathLike)):
        from shapeplan.llm.tokenizer import Tokenizer
        tokenizer = Tokenizer(os.fspath(tokenizer))
    elif tokenizer is None:
        tokenizer = read_tokenizer(f)
    return cfg, weights, tokenizer


def load_gguf(path: str, *, max_kv_cache_length: int | None = None, dtype: Any = None, device: str = "cpu",
              batch: int = 1) -> Graph:
    """The decoder graph (shapeplan/llm/model.py) of a llama-architecture GGUF file."""
    from shapeplan.llm.model import build_graph
    f = GGUFFile(path)
    cfg = read_config(f)
    if dtype is not None:
        cfg.dtype = dtype if isinstance(dtype, str) else dtype_name(dtype)
    weights = read_weights(f, cfg, device=device)
    length = max_kv_cache_length or min(4096, cfg.max_position_embeddings)
    return build_graph(cfg, weights, max_kv_cache_length=length, batch=batch, dtype=cfg.torch_dtype,
                       device=device)
