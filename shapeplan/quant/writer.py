"""``shapeplan quantize HF_DIR OUT.gguf --type Q4_K_M``: a Hugging Face Llama-family checkpoint written as a
GGUF file that llama.cpp's reader (gguf-py) accepts, with gguf's ``GGUFWriter``.

What it writes matches ``convert_hf_to_gguf`` + ``llama-quantize``: the architecture ``llama`` (model types llama
and mistral without a sliding window), ``qwen2``, ``qwen3`` or ``phi3``, its hyper-parameters, for ``llama`` the Q/K
rows interleaved for llama.cpp's rotary layout (``_permute``; its other architectures keep Hugging Face's
rotate-half rows), for ``phi3`` q/k/v and gate/up stacked (``importers.gguf.gguf_tensors``; ``attn_qkv`` in
llama.cpp's type for it, gate/up in the most precise type of its parts) and the sliding window, Llama 3 rope scaling
as a ``rope_freqs.weight`` tensor, norms and biases in F32, the matrices in the types ``recipes.tensor_types`` gives
(quantized on ``device`` by shapeplan/quant/quantize.py and kquants.py), and the tokenizer of the directory's
``tokenizer.json`` (``_tokenizer``): a byte-level BPE as ``tokenizer.ggml.model = gpt2`` with the ``pre`` name of
its split rules (Llama 3's, Qwen2's, Tekken's or GPT-2's), a SentencePiece-style BPE (byte fallback, ``▁`` for
spaces: Llama 2, Mistral) as ``llama`` with scores that order its merges. Any other kind is left out with a warning.
Tensors are quantized and written one at a time (the header first), so memory holds one tensor.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from shapeplan.errors import InputError, ModelError
from shapeplan.llm.config import LlamaConfig, inv_freq, read_json
from shapeplan.llm.weights import CheckpointWeights, _progress, expected_shapes
from shapeplan.quant.recipes import FILE_TYPES, tensor_types



@dataclass(slots=True)
class WriteSummary:
    path: str
    file_type: str
    bytes: int = 0
    types: dict[str, int] = field(default_factory=dict)     # type -> tensor count


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's Q/K row order: per head, rows [2, D/2] -> [D/2, 2] (importers/gguf.py undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


#: model_type -> the GGUF architecture it is written as
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3"}


def _arch(cfg: LlamaConfig) -> str:
    return ARCHITECTURES[cfg.model_type]


def _check(cfg: LlamaConfig, path: str) -> None:
    if cfg.model_type not in ARCHITECTURES:
        raise ModelError(f"{path}: shapeplan quantize writes model types {', '.join(ARCHITECTURES)}; got "
                         f"{cfg.model_type!r}")
    if cfg.sliding_window and _arch(cfg) != "phi3":
        raise ModelError(f"{path}: a sliding window does not exist in GGUF's {_arch(cfg)} architecture")
    if _arch(cfg) == "llama" and cfg.qk_norm:
        raise ModelError(f"{path}: a q/k norm does not exist in GGUF's llama architecture")


def _metadata(w, cfg: LlamaConfig, name: str, file_type: str) -> None:
    import gguf
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType[FILE_TYPES[file_type][1]]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.head_dim != cfg.hidden_size // cfg.num_heads or cfg.qk_norm:      # (qwen3's readers ask for it)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    w.add_vocab_size(cfg.vocab_size)
    sc = cfg.rope_scaling or {}
    if sc.get("rope_type", sc.get("type")) == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(sc["factor"]))


def _rope_factors(cfg: LlamaConfig) -> np.ndarray | None:
    """Llama 3 scaling as llama.cpp stores it: per-frequency divisors of the unscaled frequencies."""
    sc = cfg.rope_scaling or {}
    if sc.get("rope_type", sc.get("type")) != "llama3":
        return None
    base = dataclasses.replace(cfg, rope_scaling=None)
    return (inv_freq(base) / inv_freq(cfg)).numpy().astype(np.float32)


def _tokenizer(w, hf_dir: str, cfg: LlamaConfig) -> None:
    path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.exists(path):
        warnings.warn(f"{hf_dir}: no tokenizer.json; the GGUF file has no tokenizer", stacklevel=3)
        return
    tj = read_json(path)
    model = tj.get("model") or {}
    text = json.dumps([tj.get("normalizer"), tj.get("pre_tokenizer"), tj.get("decoder")])
    byte_level = model.get("type") == "BPE" and "ByteLevel" in text
    spm = model.get("type") == "BPE" and bool(model.get("byte_fallback")) and "\\u2581" in text.lower()
    if not (byte_level or spm):
        warnings.warn(f"{hf_dir}: tokenizer is neither a byte-level BPE nor a SentencePiece-style BPE (byte "
                      "fallback); the GGUF file has no tokenizer (pass tokenizer=<directory> when loading it)",
                      stacklevel=3)
        return
    vocab = dict(model["vocab"])
    special, added = set(), set()
    for a in tj.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        (special if a.get("special") else added).add(a["content"])
    tokens = [""] * max(cfg.vocab_size, max(vocab.values()) + 1)
    types = [5] * len(tokens)                                      # unused padding slots
    for t, i in vocab.items():
        tokens[i], types[i] = t, _token_type(t, special, added, model.get("unk_token"), spm)
    for i, t in enumerate(tokens):
        if not t:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if byte_level:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(_pre_name(tj.get("pre_tokenizer"), hf_dir))
    else:
        w.add_tokenizer_model("llama")
        w.add_token_scores(_scores(tokens, types, merges))
        w.add_add_space_prefix(_space_prefix(text))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    conf = {}
    tc = os.path.join(hf_dir, "tokenizer_config.json")
    if os.path.exists(tc):
        conf = read_json(tc)
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else vocab.get(conf.get("bos_token") or "")
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else vocab.get(conf.get("eos_token") or "")
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None:
        w.add_eos_token_id(int(eos))
    pad = conf.get("pad_token")
    pad = vocab.get(pad.get("content") if isinstance(pad, dict) else pad or "")
    if pad is not None:                                             # (as convert_hf_to_gguf writes it)
        w.add_pad_token_id(int(pad))
    w.add_add_bos_token(bool(conf.get("add_bos_token", True)))
    if conf.get("chat_template"):
        w.add_chat_template(conf["chat_template"])


def _token_type(t: str, special: set[str], added: set[str], unk: str | None, spm: bool) -> int:
    """llama.cpp's token type: 1 normal, 2 unknown, 3 control, 4 user-defined (an added token that is not
    special), 6 byte (a SentencePiece vocabulary's ``<0xNN>``)."""
    if t == unk:
        return 2
    if t in special:
        return 3
    if t in added:
        return 4
    if spm and len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
        return 6
    return 1


def _scores(tokens: list[str], types: list[int], merges: list[str]) -> list[float]:
    """SentencePiece scores consistent with the BPE merges (llama.cpp merges the pair whose piece scores
    highest): the piece the merge of rank r makes scores -r, a normal piece no merge makes scores below every
    merge's, the others 0."""
    made: dict[str, int] = {}
    for r, m in enumerate(merges):
        made.setdefault(m.replace(" ", "", 1), r)
    return [float(-made[t]) if t in made else float(-len(merges) - i) if ty == 1 else 0.0
            for i, (t, ty) in enumerate(zip(tokens, types))]


def _space_prefix(text: str) -> bool:
    """Whether a SentencePiece-style tokenizer.json (its normalizer, pre-tokenizer and decoder as JSON text)
    puts a ``▁`` before the text: a Prepend normalizer, or a Metaspace that does not say never."""
    if '"prepend_scheme": "never"' in text or '"add_prefix_space": false' in text:
        return False
    return '"type": "Prepend"' in text or '"prepend_scheme"' in text or '"add_prefix_space": true' in text


def _pre_name(pre: object, hf_dir: str) -> str:
    """``tokenizer.ggml.pre`` for a byte-level BPE's pre-tokenizer: the name llama.cpp gives its split regex."""
    from shapeplan.importers.gguf import _SPLITS
    regexes = [p.get("pattern", {}).get("Regex") for p in _walk(pre) if p.get("type") == "Split"]
    if not regexes:
        return "default"                                            # GPT-2's rules (ByteLevel's own regex)
    for name in ("llama-bpe", "qwen2", "tekken"):
        if regexes[0] == _SPLITS[name]:
            return name
    warnings.warn(f"{hf_dir}: the tokenizer's split regex is not one GGUF names (Llama 3's, Qwen2's, Tekken's, "
                  "GPT-2's); the file says 'default' (GPT-2's rules), so a reader may split text differently",
                  stacklevel=4)
    return "default"


def _walk(node: object) -> list[dict]:
    """Every dict of a pre-tokenizer's JSON, a Sequence's members included."""
    if not isinstance(node, dict):
        return []
    return [node] + [d for p in node.get("pretokenizers") or [] for d in _walk(p)]


def write_gguf(hf_dir: str, out: str, file_type: str = "Q4_K_M", *, device: str = "cpu",
               progress: bool | None = None) -> WriteSummary:
    """Write the checkpoint ``hf_dir`` as ``out`` in ``file_type`` (``recipes.FILE_TYPES``)."""
    cfg = LlamaConfig.from_file(hf_dir)
    _check(cfg, hf_dir)
    ckpt = CheckpointWeights(hf_dir, cfg)
    shapes = expected_shapes(cfg)
    for hf, shape in shapes.items():
        ckpt.get(hf, shape)                                             # validate everything first
    return _write(cfg, lambda hf: ckpt.get(hf, shapes[hf]), out, file_type, device=device, progress=progress,
                  name=os.path.basename(os.path.normpath(hf_dir)) or "model", tokenizer_dir=hf_dir)


def write_preset_gguf(preset: str, out: str, file_type: str = "Q4_K_M", *, device: str = "cpu", seed: int = 0,
                      progress: bool | None = None) -> WriteSummary:
    """Random weights with a preset's shapes (``llm.config.PRESETS``, as ``shapeplan bench --preset``
    makes them) written as ``out``: the benchmark files, no checkpoint needed."""
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.weights import random_weights
    cfg = preset_config(preset, "bfloat16")
    weights = random_weights(cfg, device=device, seed=seed)
    return _write(cfg, weights.__getitem__, out, file_type, device=device, progress=progress, name=preset)


def _write(cfg: LlamaConfig, get, out: str, file_type: str, *, device: str, progress: bool | None, name: str,
           tokenizer_dir: str | None = None) -> WriteSummary:
    import gguf
    if file_type not in FILE_TYPES:
        raise InputError(f"unknown GGUF file type {file_type!r}; choose one of {', '.join(FILE_TYPES)}")
    from shapeplan.importers.gguf import gguf_tensors
    from shapeplan.quant.recipes import stacked_type
    shapes, types = expected_shapes(cfg), tensor_types(cfg, file_type)
    w = gguf.GGUFWriter(out, _arch(cfg))
    _metadata(w, cfg, name, file_type)
    if tokenizer_dir is not None:
        _tokenizer(w, tokenizer_dir, cfg)
    rope = _rope_factors(cfg)
    layout = gguf_tensors(cfg)                 # (gguf name, its Hugging Face parts): Phi-3's stacked q/k/v, gate/up
    first = {"model.embed_tokens.weight": 0, "model.norm.weight": 2, "lm_head.weight": 3}
    order = sorted(layout, key=lambda e: first.get(e[1][0], 1))          # (stable: the layers keep their order)
    summary = WriteSummary(out, file_type)
    infos = []                                                          # (hf parts, gguf name, type)
    if rope is not None:
        w.add_tensor_info("rope_freqs.weight", rope.shape, np.dtype(np.float32), rope.nbytes)
    for g, parts in order:
        # a stacked attn_qkv takes llama.cpp's own rule (Q4_K_M: Q5_K), any other stack its parts' most precise type
        part_types = [types.get(p, "F32") for p in parts]
        t = stacked_type(cfg, file_type, g, part_types) if len(parts) > 1 else part_types[0]
        shape = (sum(shapes[p][0] for p in parts), *shapes[parts[0]][1:])
        nbytes, dt, raw = _layout(t, shape)
        w.add_tensor_info(g, shape if raw is None else (shape[0], nbytes // shape[0]), dt, nbytes, raw_dtype=raw)
        infos.append((parts, g, t))
        summary.types[t] = summary.types.get(t, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    if rope is not None:
        w.write_tensor_data(rope)
    for parts, g, t in _progress(infos, progress, f"quantizing to {file_type}"):
        arr = _encode(torch.cat([_rows(get(hf), hf, cfg, device) for hf in parts]), t, g)
        w.write_tensor_data(arr)
        summary.bytes += arr.nbytes
    w.close()
    return summary


def _layout(t: str, shape: tuple[int, ...]):
    """(bytes, numpy dtype, GGML raw type or None) of a tensor of type ``t``."""
    import gguf
    from shapeplan.quant.formats import QTYPES
    n = int(np.prod(shape))
    if t == "F32":
        return 4 * n, np.dtype(np.float32), None
    if t == "F16":
        return 2 * n, np.dtype(np.float16), None
    if t == "BF16":
        return 2 * n, np.dtype(np.uint8), gguf.GGMLQuantizationType.BF16
    q = QTYPES[t]
    return shape[0] * q.row_bytes(shape[1]), np.dtype(np.uint8), gguf.GGMLQuantizationType(q.ggml_id)


def _rows(t: torch.Tensor, hf: str, cfg: LlamaConfig, device: str) -> torch.Tensor:
    """One Hugging Face tensor as float32 rows of the file: the llama architecture's Q/K permuted."""
    x = t.to(device=device, dtype=torch.float32)
    if _arch(cfg) == "llama" and hf.endswith("q_proj.weight"):
        return _permute(x, cfg.num_heads)
    if _arch(cfg) == "llama" and hf.endswith("k_proj.weight"):
        return _permute(x, cfg.num_kv_heads)
    return x


def _encode(x: torch.Tensor, kind: str, g: str) -> np.ndarray:
    """A tensor's bytes in the file: cast, or quantized."""
    from shapeplan.quant.quantize import quantize
    if kind == "F32":
        return x.cpu().numpy()
    if kind == "F16":
        return x.to(torch.float16).cpu().numpy()
    if kind == "BF16":
        return x.to(torch.bfloat16).view(torch.uint8).reshape(x.shape[0], -1).cpu().numpy()
    return quantize(x, kind, tensor=g).cpu().numpy()
