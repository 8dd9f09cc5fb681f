"""Which type each weight gets: GGUF file types (``shapeplan quantize --type``) and the load-time
``quantize=`` of ``from_pretrained``, then quantizing a weight dict in place.

File types follow llama.cpp's rules for Llama-family models (``llama_tensor_get_type`` without an
importance matrix; its 70B, Falcon and mixture-of-experts cases left out):

- every 2-D weight in the base type; norms stay float32;
- the LM head (``output.weight``, or the embedding table when it is tied) in Q6_K, unless the base type
  has more bits (Q8_0, F16, BF16, F32);
- per tensor kind (``_rule``): ``attn_v``, ``ffn_down`` and ``attn_output`` get more bits in Q2_K,
  Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_M, IQ4_NL and IQ4_XS files, some on the first layers, some on
  llama.cpp's "more bits" layers (the first and last eighth of the stack and every third layer between);
  a stacked ``attn_qkv`` (Phi-3) its own type;
- a K-quant whose rows are not a multiple of 256 falls back as llama.cpp does (Q2_K/Q3_K -> Q4_0,
  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL); rows not a multiple of 32 stay F16.

``quantize="int8"`` / ``"int4"``: every 2-D weight (projections, embedding table, LM head) in
INT8_G128 / INT4_G64 (shapeplan/quant/formats.py); any file type above is accepted there too.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import InputError
from shapeplan.llm.config import LlamaConfig
from shapeplan.llm.weights import expected_shapes

#: file type -> (base type, LlamaFileType name); the output rule and *_M rule apply as documented
FILE_TYPES = {
    "F32": ("F32", "ALL_F32"), "F16": ("F16", "MOSTLY_F16"), "BF16": ("BF16", "MOSTLY_BF16"),
    "Q8_0": ("Q8_0", "MOSTLY_Q8_0"), "Q4_0": ("Q4_0", "MOSTLY_Q4_0"), "Q4_1": ("Q4_1", "MOSTLY_Q4_1"),
    "Q5_0": ("Q5_0", "MOSTLY_Q5_0"), "Q5_1": ("Q5_1", "MOSTLY_Q5_1"), "Q2_K": ("Q2_K", "MOSTLY_Q2_K"),
    "Q3_K_S": ("Q3_K", "MOSTLY_Q3_K_S"), "Q3_K_M": ("Q3_K", "MOSTLY_Q3_K_M"), "Q3_K_L": ("Q3_K", "MOSTLY_Q3_K_L"),
    "Q4_K_S": ("Q4_K", "MOSTLY_Q4_K_S"), "Q4_K_M": ("Q4_K", "MOSTLY_Q4_K_M"),
    "Q5_K_S": ("Q5_K", "MOSTLY_Q5_K_S"), "Q5_K_M": ("Q5_K", "MOSTLY_Q5_K_M"), "Q6_K": ("Q6_K", "MOSTLY_Q6_K"),
    "IQ4_NL": ("IQ4_NL", "MOSTLY_IQ4_NL"), "IQ4_XS": ("IQ4_XS", "MOSTLY_IQ4_XS"),
}
LOAD_TIME = {"int8": "INT8_G128", "int4": "INT4_G64"}
_FLOAT = ("F32", "F16", "BF16")
_TORCH_FLOAT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
_RANK = ["Q2_K", "Q3_K", "Q4_0", "Q4_1", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "BF16",
         "F16", "F32"]


def most_precise(types: Any) -> str:
    """The most precise of some type names (a name this table does not rank counts as the most precise)."""
    return max(types, key=lambda t: _RANK.index(t) if t in _RANK else len(_RANK))


def more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _rule(spec: str, kind: str, layer: int, n_layers: int, gqa: int) -> str | None:
    """llama.cpp's type for one tensor of a file type where it differs from the base type, else None.
    ``kind``: attn_v, ffn_down, attn_output or attn_qkv (a stacked q/k/v); ``gqa``: query heads per KV head."""
    if kind == "attn_v":
        if spec == "Q2_K":
            return "Q4_K" if gqa >= 4 else "Q3_K"
        if spec == "Q3_K_M":
            return "Q5_K" if layer < 2 else "Q4_K"
        if spec == "Q3_K_L" or (spec in ("IQ4_NL", "IQ4_XS") and gqa >= 4) or (spec == "Q4_K_S" and layer < 4):
            return "Q5_K"
        if spec in ("Q4_K_M", "Q5_K_M") and more_bits(layer, n_layers):
            return "Q6_K"
    elif kind == "ffn_down":
        if spec == "Q2_K":
            return "Q3_K"
        if spec == "Q3_K_M":
            return "Q5_K" if layer < n_layers // 16 else "Q4_K"
        if spec == "Q3_K_L" or (spec in ("IQ4_NL", "IQ4_XS", "Q4_K_S") and layer < n_layers // 8):
            return "Q5_K"
        if spec in ("Q4_K_M", "Q5_K_M") and more_bits(layer, n_layers):
            return "Q6_K"
    elif kind == "attn_output":
        return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(spec)
    elif kind == "attn_qkv":
        return {"Q3_K_M": "Q4_K", "Q3_K_L": "Q4_K", "Q4_K_M": "Q5_K", "Q5_K_M": "Q6_K"}.get(spec)
    return None


_KINDS = {"v_proj": "attn_v", "down_proj": "ffn_down", "o_proj": "attn_output"}


def stacked_type(cfg: LlamaConfig, spec: str, gguf_name: str, part_types: list[str]) -> str:
    """The type of a tensor a GGUF file stacks from several weights (Phi-3's ``attn_qkv``, ``ffn_up``):
    llama.cpp's ``attn_qkv`` rule for a file type that has one, else the most precise of the parts' types."""
    if spec in FILE_TYPES and gguf_name.endswith("attn_qkv.weight"):
        t = _rule(spec, "attn_qkv", 0, cfg.num_layers, 1)
        if t is not None:
            return _fits(t, cfg.hidden_size)
    return most_precise(part_types)


def _fits(t: str, k: int) -> str:
    while t in _FALLBACK and k % 256:
        t = _FALLBACK[t]
    return "F16" if t not in _FLOAT and k % 32 else t


def tensor_types(cfg: LlamaConfig, spec: str) -> dict[str, str]:
    """Hugging Face name -> type for every 2-D weight of ``cfg`` (1-D tensors are not listed: they stay
    float). ``spec``: a FILE_TYPES name, ``int8`` / ``int4``, or another type name of
    shapeplan/quant/formats.py (every weight in it)."""
    from shapeplan.quant.formats import QTYPES
    shapes = expected_shapes(cfg)
    if spec not in FILE_TYPES and (spec in LOAD_TIME or spec in QTYPES):
        t = LOAD_TIME.get(spec, spec)
        return {n: t for n, s in shapes.items() if len(s) == 2}
    if spec not in FILE_TYPES:
        raise InputError(f"unknown quantization {spec!r}; choose int8, int4, a GGUF file type "
                         f"({', '.join(FILE_TYPES)}) or a type ({', '.join(QTYPES)})")
    base = FILE_TYPES[spec][0]
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    gqa = cfg.num_heads // cfg.num_kv_heads
    out = {}
    for name, shape in shapes.items():
        if len(shape) != 2:
            continue
        t = base
        kind = _KINDS.get(name.split(".")[-2]) if name.startswith("model.layers.") else None
        if name == head and _RANK.index(base) < _RANK.index("Q6_K"):
            t = "Q6_K"
        elif kind is not None:
            t = _rule(spec, kind, int(name.split(".")[2]), cfg.num_layers, gqa) or base
        out[name] = _fits(t, shape[1])
    return out


def quantize_weights(cfg: LlamaConfig, weights: dict, spec: str, *, progress: bool | None = None) -> dict:
    """Replace the 2-D weights of ``weights`` (Hugging Face names) by QuantWeights as ``tensor_types``
    says, one at a time on the weights' own device (the float tensor is dropped as soon as its packed
    form exists). Float types stay tensors (cast). Returns ``weights``."""
    from shapeplan.llm.weights import _progress
    from shapeplan.quant.quantize import quantize_weight
    types = tensor_types(cfg, spec)
    for name in _progress(list(types), progress, f"quantizing to {spec}"):
        t, w = types[name], weights[name]
        if not isinstance(w, torch.Tensor):
            continue                                                  # already quantized
        weights[name] = w.to(_TORCH_FLOAT[t]) if t in _FLOAT else quantize_weight(w, t, tensor=name)
    return weights
