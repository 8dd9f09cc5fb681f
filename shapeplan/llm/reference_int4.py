"""The int4 baseline of ``shapeplan bench --vs-torch-compile``: the gpt-fast recipe, weight-only int4
with group-wise scales and zero points (group 64) run by torch's tinygemm kernel
(``aten._weight_int4pack_mm``) inside the PyTorch decoder of ``llm/reference.py``.

Quantization as gpt-fast's ``WeightOnlyInt4QuantHandler``: per group of 64 along K, scale =
(max - min) / 15, zero = min + 8 * scale, q = round((w - min) / scale) in 0..15, w ~ (q - 8) * scale +
zero. Every projection and the LM head (for tied embeddings, an int4 copy of the table; the lookup
keeps the bf16 table) are replaced by an ``Int4Linear``. CUDA packs with
``_convert_weight_to_int4pack``; the CPU has its own packing (``*_for_cpu``), used by the tests only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shapeplan.llm.config import LlamaConfig
from shapeplan.llm.weights import expected_shapes


@dataclass(slots=True)
class Int4Linear:
    packed: torch.Tensor            # tinygemm layout (device specific)
    scales_and_zeros: torch.Tensor  # [K / group, N, 2] bfloat16
    n: int
    k: int
    group: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.k).to(torch.bfloat16)
        if self.packed.is_cuda:
            y = torch.ops.aten._weight_int4pack_mm(x2, self.packed, self.group, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group, self.scales_and_zeros)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.n)

    def tensors(self) -> list[torch.Tensor]:
        return [self.packed, self.scales_and_zeros]


def int4_linear(w: torch.Tensor, group: int = 64, inner_k_tiles: int = 8) -> Int4Linear:
    """``w`` [N, K] (K a multiple of ``group`` and of 16 * inner_k_tiles) -> an Int4Linear."""
    n, k = w.shape
    wf = w.float().reshape(n, k // group, group)
    hi, lo = wf.amax(-1, keepdim=True), wf.amin(-1, keepdim=True)
    scales = (hi - lo).clamp(min=1e-6) / 15
    zeros = lo + scales * 8
    q = ((wf - lo) / scales).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    sz = torch.cat([scales, zeros], dim=2).transpose(0, 1).contiguous().to(torch.bfloat16)   # [K/g, N, 2]
    if w.is_cuda:
        packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8),
                                                            inner_k_tiles)
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, inner_k_tiles)
    return Int4Linear(packed, sz, n, k, group)


def int4_weights(cfg: LlamaConfig, weights: dict[str, torch.Tensor], group: int = 64) -> dict:
    """A copy of ``weights`` with every projection and the LM head as Int4Linear (norms, biases and the
    embedding table unchanged)."""
    out = dict(weights)
    for name, shape in expected_shapes(cfg).items():
        if len(shape) == 2 and name != "model.embed_tokens.weight":
            out[name] = int4_linear(weights[name], group)
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = int4_linear(weights["model.embed_tokens.weight"], group)
    return out
