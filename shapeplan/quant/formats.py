"""Quantized weight formats: the table of block types and ``QuantWeight``, a packed weight.

A quantized weight is a ``[N, K]`` matrix (N output rows, K input features) whose every row is a run
of blocks of ``block`` consecutive elements, ``type_size`` bytes each, exactly as a GGUF file stores
it: ``packed`` is a uint8 tensor ``[N, K // block * type_size]``. Rows are independent, so row
permutations (llama.cpp's Q/K interleave) and row stacking (fused q/k/v) work on the packed bytes.

Besides the GGUF types there are the load-time types of ``from_pretrained(quantize="int8"|"int4")``
(``shapeplan/quant/groupwise.py``), with the same block layouts as Q8_0 / Q4_1 and a group of 64 or
128 instead of 32:

- ``INT8_G{64,128}``: ``[d: f16][q: int8 x G]``, w = q * d (Q8_0 is ``INT8_G32``)
- ``INT4_G{64,128}``: ``[d: f16][m: f16][q: G/2 bytes]``, byte j holds element j (low nibble) and
  element j + G/2 (high nibble), w = d * q + m (Q4_1 is ``INT4_G32``)

``tile`` is how the kernels see a 256-element chunk of a row: ``(sub-blocks, elements each)``, one
scale per sub-block (shapeplan/runtime/backends/triton/kernels/gguf.py).

Three types are layouts of our own, made at load from a GGUF type (``SHAPEPLAN_QUANT_REPACK``; the GGUF
importer's device arena, shapeplan/importers/gguf.py): ``Q4_K_R``, ``Q8_0_R`` and ``Q6_K_R`` hold the
bytes of Q4_K, Q8_0 and Q6_K with each row's blocks split into runs, first every block's code bytes, then
every block's header bytes (``REPACKED``: Q4_K's 128 code bytes, then its 16-byte
``[d|dmin][scales x 12]``; Q8_0's 32 codes, then its 2-byte ``d``; Q6_K's 192 bytes of ``ql`` + ``qh``,
then its 16 int8 scales, then its 2-byte ``d``), in block order. Same bytes per row, so rows still stack
and permute. Every block's codes then start aligned: in the file's layout a Q4_K super-block's codes sit
16 bytes into its 144 (every other super-block's codes straddle one more 32-byte sector), and Q8_0's
34-byte and Q6_K's 210-byte blocks are 2 bytes off word alignment every other block (so the one-row
kernels read them as 32-bit words, the odd block realigned with funnel shifts, never as 16-byte loads).
``repack`` / ``unrepack`` convert; a file written by shapeplan is always in the file's layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shapeplan.errors import ModelError


class QuantTypeError(ModelError):
    """A tensor has a quantization type that shapeplan's kernels do not run."""


@dataclass(frozen=True, slots=True)
class QType:
    name: str
    ggml_id: int | None          # gguf.GGMLQuantizationType value; None: ours, not in GGUF
    block: int                   # elements per block
    type_size: int               # bytes per block
    kind: str                    # kernel family (one decoder each in the Triton kernels)
    tile: tuple[int, int]        # a 256-element chunk as (sub-blocks, elements each)

    def row_bytes(self, k: int) -> int:
        return k // self.block * self.type_size


def _t(name: str, gid: int | None, block: int, size: int, kind: str, tile: tuple[int, int]) -> QType:
    return QType(name, gid, block, size, kind, tile)


QTYPES: dict[str, QType] = {q.name: q for q in (
    _t("Q4_0", 2, 32, 18, "q4_0", (8, 32)),
    _t("Q4_1", 3, 32, 20, "int4", (8, 32)),
    _t("Q5_0", 6, 32, 22, "q5_0", (8, 32)),
    _t("Q5_1", 7, 32, 24, "q5_1", (8, 32)),
    _t("Q8_0", 8, 32, 34, "int8", (8, 32)),
    _t("Q2_K", 10, 256, 84, "q2_k", (16, 16)),
    _t("Q3_K", 11, 256, 110, "q3_k", (16, 16)),
    _t("Q4_K", 12, 256, 144, "q4_k", (8, 32)),
    _t("Q4_K_R", None, 256, 144, "q4_k_r", (8, 32)),          # Q4_K, codes and headers apart (module doc)
    _t("Q8_0_R", None, 32, 34, "q8_0_r", (8, 32)),            # Q8_0, the same
    _t("Q6_K_R", None, 256, 210, "q6_k_r", (16, 16)),         # Q6_K, the same (three runs)
    _t("Q5_K", 13, 256, 176, "q5_k", (8, 32)),
    _t("Q6_K", 14, 256, 210, "q6_k", (16, 16)),
    _t("IQ4_NL", 20, 32, 18, "iq4_nl", (8, 32)),
    _t("IQ4_XS", 23, 256, 136, "iq4_xs", (8, 32)),
    _t("INT8_G64", None, 64, 66, "int8", (4, 64)),
    _t("INT8_G128", None, 128, 130, "int8", (2, 128)),
    _t("INT4_G64", None, 64, 36, "int4", (4, 64)),
    _t("INT4_G128", None, 128, 68, "int4", (2, 128)),
)}

#: GGUF types kept packed on load (F32 / F16 / BF16 are plain tensors)
GGUF_TYPES = tuple(n for n, q in QTYPES.items() if q.ggml_id is not None)
#: non-linear 4-bit values of IQ4_NL / IQ4_XS (the GGUF format's table)
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def qtype(name: str, *, tensor: str = "<tensor>") -> QType:
    """The QType ``name``; QuantTypeError naming ``tensor`` and the supported types otherwise."""
    q = QTYPES.get(name)
    if q is None:
        raise QuantTypeError(f"tensor {tensor!r} has quantization type {name}, which shapeplan does not run "
                             f"(supported: F32, F16, BF16, {', '.join(GGUF_TYPES)})")
    return q


@dataclass(slots=True)
class QuantWeight:
    """A packed ``[N, K]`` weight: ``packed`` uint8 ``[N, K // block * type_size]`` (see module doc)."""

    packed: torch.Tensor
    qtype: str
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        q = qtype(self.qtype)
        n, k = self.shape
        if k % q.block or self.packed.dtype != torch.uint8 or tuple(self.packed.shape) != (n, q.row_bytes(k)):
            raise ModelError(f"{self.qtype} weight of shape {list(self.shape)} needs uint8 "
                             f"[{n}, {q.row_bytes(k) if not k % q.block else '?'}] packed bytes, got "
                             f"{self.packed.dtype} {list(self.packed.shape)} (K a multiple of {q.block})")

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def to(self, device: str | torch.device) -> "QuantWeight":
        return QuantWeight(self.packed.to(device), self.qtype, self.shape)

    def rows(self, index: torch.Tensor | slice) -> "QuantWeight":
        """The rows ``index`` (a permutation or a slice) as another QuantWeight."""
        p = self.packed[index]
        return QuantWeight(p, self.qtype, (p.shape[0], self.shape[1]))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        from shapeplan.quant.dequant import dequantize
        return dequantize(self.packed, self.qtype).to(dtype)


def dequantized(weights: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """``weights`` with every ``QuantWeight`` dequantized into ``dtype`` (the values each call of a packed graph
    dequantizes), the rest as they are: a CPU pipeline's ``SHAPEPLAN_QUANT_CPU=unpack``, the PyTorch
    baselines of a GGUF file."""
    return {k: w.dequantize(dtype) if isinstance(w, QuantWeight) else w for k, w in weights.items()}


#: our layouts (module doc): name -> (the GGUF type whose bytes it holds, the runs of a row: each run is one
#: byte range of a block, taken from every block in turn)
REPACKED: dict[str, tuple[str, tuple[tuple[int, int], ...]]] = {
    "Q4_K_R": ("Q4_K", ((16, 144), (0, 16))),                 # codes, then [d|dmin][scales x 12]
    "Q8_0_R": ("Q8_0", ((2, 34), (0, 2))),                    # codes, then d
    "Q6_K_R": ("Q6_K", ((0, 192), (192, 208), (208, 210))),   # ql + qh, then the int8 scales, then d
}
#: GGUF type -> our layout of it
REPACK_OF = {src: name for name, (src, _) in REPACKED.items()}


def repack(packed: torch.Tensor, name: str) -> torch.Tensor:
    """Rows uint8 ``[..., R]`` of ``REPACKED[name]``'s GGUF type -> the same rows in layout ``name``
    (run after run: the run's byte range of every block), a new tensor."""
    lead, ts, runs, nb = _blocks(packed, name)
    b = packed.reshape(*lead, nb, ts)
    return torch.cat([b[..., a:z].reshape(*lead, nb * (z - a)) for a, z in runs], dim=-1)


def unrepack(packed: torch.Tensor, name: str) -> torch.Tensor:
    """Rows in layout ``name`` -> the same rows in the GGUF type's (the file's) layout, a new tensor."""
    lead, ts, runs, nb = _blocks(packed, name)
    out = torch.empty(*lead, nb, ts, dtype=torch.uint8, device=packed.device)
    at = 0
    for a, z in runs:
        out[..., a:z] = packed[..., at:at + nb * (z - a)].reshape(*lead, nb, z - a)
        at += nb * (z - a)
    return out.reshape(*lead, nb * ts)


def _blocks(packed: torch.Tensor, name: str) -> tuple[tuple[int, ...], int, tuple[tuple[int, int], ...], int]:
    src, runs = REPACKED[name]
    ts = QTYPES[src].type_size
    if packed.dtype != torch.uint8 or packed.shape[-1] % ts:
        raise ModelError(f"{src} rows must be uint8 [..., {ts} x blocks] (whole blocks), got {packed.dtype} "
                         f"{list(packed.shape)}")
    return tuple(packed.shape[:-1]), ts, runs, packed.shape[-1] // ts
