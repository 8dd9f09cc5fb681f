"""Dequantization of packed blocks in torch (any device): the reference the kernels are tested against
and the CPU path of the quantized ops (``shapeplan/ops/quantized.py`` dequantizes per call).

Each decoder takes ``b``: uint8 ``[n, type_size]`` (one block per row) and returns float32
``[n, block]``. The arithmetic is gguf-py's (``gguf.quants.dequantize``), operation for operation in
float32, so the results are bit-identical (tests/quant/test_dequant.py).
"""
from __future__ import annotations

from typing import Callable

import torch

from shapeplan.quant.formats import IQ4_VALUES, REPACKED, qtype, unrepack


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The little-endian float16 at byte ``at`` of each block, as float32 [n, 1]."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()


def _shifts(*bits: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.uint8, device=device)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes [n, B] -> [n, 2B]: all low nibbles, then all high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _bits32(b: torch.Tensor, at: int) -> torch.Tensor:
    """The 32 bits of the little-endian uint32 at ``at``, bit j at column j: [n, 32] uint8."""
    by = b[:, at:at + 4]                                                           # [n, 4]
    return ((by[:, :, None] >> _shifts(*range(8), device=b.device)) & 1).reshape(-1, 32)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(b[:, 2:18]).to(torch.int16) - 8).float()
    return _f16(b, 0) * q


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(b[:, 6:22]) | (_bits32(b, 2) << 4)).to(torch.int16) - 16
    return _f16(b, 0) * q.float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(b[:, 8:24]) | (_bits32(b, 4) << 4)).float()
    return (_f16(b, 0) * q) + _f16(b, 2)


def _int8(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b, 0)


def _int4(b: torch.Tensor) -> torch.Tensor:
    return (_f16(b, 0) * _nibbles(b[:, 4:]).float()) + _f16(b, 2)


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=b.device)
    return _f16(b, 0) * table[_nibbles(b[:, 2:18]).long()]


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, qs = b[:, 0:16], b[:, 16:80]
    dl = (_f16(b, 80) * (sc & 0x0F).float()).reshape(n, 16, 1)
    ml = (_f16(b, 82) * (sc >> 4).float()).reshape(n, 16, 1)
    q = (qs.reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6, device=b.device).reshape(1, 1, 4, 1)) & 3
    return (dl * q.reshape(n, 16, 16).float() - ml).reshape(n, 256)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n, dev = b.shape[0], b.device
    hmask, qs, s = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    lo = (s[:, 0:8].reshape(n, 1, 8) >> _shifts(0, 4, device=dev).reshape(1, 2, 1)).reshape(n, 16)
    hi = (s[:, 8:12].reshape(n, 1, 4) >> _shifts(0, 2, 4, 6, device=dev).reshape(1, 4, 1)).reshape(n, 16)
    scales = ((lo & 0x0F) | ((hi & 0x03) << 4)).to(torch.int16) - 32
    dl = (_f16(b, 108) * scales.float()).reshape(n, 16, 1)
    ql = (qs.reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6, device=dev).reshape(1, 1, 4, 1)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, 1, 1, 32) >> _shifts(*range(8), device=dev).reshape(1, 1, 8, 1)).reshape(n, 16, 16) & 1
    q = ql.to(torch.int16) - ((qh ^ 1) << 2).to(torch.int16)
    return (dl * q.float()).reshape(n, 256)


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: the 12 scale bytes -> 6-bit scales and mins of the 8 sub-blocks, [n, 8] each."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn.float()).reshape(n, 8, 1)
    q = (b[:, 16:144].reshape(n, 4, 1, 32) >> _shifts(0, 4, device=b.device).reshape(1, 1, 2, 1)) & 0x0F
    return (d * q.reshape(n, 8, 32).float() - dm).reshape(n, 256)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n, dev = b.shape[0], b.device
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn.float()).reshape(n, 8, 1)
    ql = (b[:, 48:176].reshape(n, 4, 1, 32) >> _shifts(0, 4, device=dev).reshape(1, 1, 2, 1)) & 0x0F
    qh = (b[:, 16:48].reshape(n, 1, 1, 32) >> _shifts(*range(8), device=dev).reshape(1, 1, 8, 1)) & 1
    q = ql.reshape(n, 8, 32) | (qh.reshape(n, 8, 32) << 4)
    return (d * q.float() - dm).reshape(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n, dev = b.shape[0], b.device
    d = (_f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).float()).reshape(n, 16, 1)
    ql = ((b[:, 0:128].reshape(n, 2, 1, 64) >> _shifts(0, 4, device=dev).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    qh = ((b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6, device=dev).reshape(1, 1, 4, 1)) & 3).reshape(n, 8, 32)
    q = (ql | (qh << 4)).to(torch.int16) - 32
    return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n, dev = b.shape[0], b.device
    sh = b[:, 2:4].to(torch.int32)
    sh = sh[:, 0:1] | (sh[:, 1:2] << 8)                                                # uint16 [n, 1]
    hi = (sh >> torch.arange(0, 16, 2, device=dev, dtype=torch.int32).reshape(1, 8)) & 3
    lo = (b[:, 4:8].reshape(n, 4, 1) >> _shifts(0, 4, device=dev).reshape(1, 1, 2)).reshape(n, 8) & 0x0F
    scales = (lo.to(torch.int32) | (hi << 4)) - 32
    dl = (_f16(b, 0) * scales.float()).reshape(n, 8, 1)
    q = (b[:, 8:136].reshape(n, 8, 1, 16) >> _shifts(0, 4, device=dev).reshape(1, 1, 2, 1)) & 0x0F
    table = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=dev)
    return (dl * table[q.reshape(n, 8, 32).long()]).reshape(n, 256)


_DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "q4_0": _q4_0, "q5_0": _q5_0, "q5_1": _q5_1, "int8": _int8, "int4": _int4, "iq4_nl": _iq4_nl,
    "q2_k": _q2_k, "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k, "iq4_xs": _iq4_xs,
}


def dequantize(packed: torch.Tensor, name: str) -> torch.Tensor:
    """uint8 ``[..., R]`` rows of ``name`` blocks -> float32 ``[..., R / type_size * block]``."""
    if name in REPACKED:                        # our layout of a GGUF type: back to the file's, then as that type
        packed, name = unrepack(packed, name), REPACKED[name][0]
    q = qtype(name)
    lead, r = packed.shape[:-1], packed.shape[-1]
    blocks = packed.reshape(-1, q.type_size)
    out = _DECODERS[q.kind](blocks) if blocks.shape[0] else blocks.new_empty((0, q.block), dtype=torch.float32)
    return out.reshape(*lead, r // q.type_size * q.block)
