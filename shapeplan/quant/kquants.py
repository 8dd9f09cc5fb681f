"""Our K-quant quantizers (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_NL / IQ4_XS, written from the block formats.

gguf-py quantizes only the simple types; these fill the K-quant blocks that ``gguf.quants.dequantize``
(and llama.cpp) read. Each 256-element super-block is cut into sub-blocks (16 or 32 elements) with
their own scale (and min), and those scales are stored as small integers times one float16 per
super-block. The method, per super-block:

1. every sub-block gets the scale (and min) minimising its squared error: a few candidate scales
   around the range-derived one, each followed by a least-squares refit of (scale, min) for the
   integer codes it gives; the best candidate is kept;
2. the sub-block scales (mins) are quantized against the largest one (6 / 4 / 8 bits);
3. the codes are recomputed with the stored scales exactly as the dequantizer multiplies them out.

Affine types (Q2_K, Q4_K, Q5_K) hold w = (d*sc)*q - (dmin*m), q in [0, 2^b - 1], m >= 0; symmetric types
(Q3_K, Q6_K) hold w = (d*sc)*q, q in [-2^(b-1), 2^(b-1) - 1], the largest |w| of a sub-block mapped to
the negative end (one more level there). IQ4_NL / IQ4_XS (codes index 16 fixed non-linear levels,
-127..113) search each 32-element block's scale as llama.cpp does without an importance matrix (the
largest element at a few table levels, least-squares refits: plain squared error, not llama.cpp's
x²-weighted one); IQ4_XS then stores the eight scales as 6-bit multiples of one float16. Errors:
tests/quant/test_quantize.py.
"""
from __future__ import annotations

from typing import Callable

import torch

from shapeplan.quant.formats import IQ4_VALUES
from shapeplan.quant.quantize import _pack_nibbles

_CANDIDATES = torch.linspace(-0.5, 1.0, 7).tolist()     # offsets to the number of levels of step 1


def _lstsq_affine(x: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, m) minimising sum (s*q - m - x)^2 with m >= 0 (the min is never above 0), per row."""
    n = x.shape[1]
    sq, sqq, sx, sqx = q.sum(1, keepdim=True), (q * q).sum(1, keepdim=True), x.sum(1, keepdim=True), \
        (q * x).sum(1, keepdim=True)
    det = n * sqq - sq * sq
    ok = det > 0
    s = torch.where(ok, (n * sqx - sq * sx) / torch.where(ok, det, torch.ones_like(det)), torch.zeros_like(det))
    b = (sx - s * sq) / n
    pos = b > 0
    s_nob = torch.where(sqq > 0, sqx / torch.where(sqq > 0, sqq, torch.ones_like(sqq)), torch.zeros_like(sqq))
    s = torch.where(pos, s_nob, s).clamp(min=0)
    m = torch.where(pos, torch.zeros_like(b), -b)
    return s, m


def _fit_affine(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sub-blocks [n, L] -> (scale, min) [n, 1] each, both >= 0, for codes 0..nmax."""
    lo = x.amin(1, keepdim=True).clamp(max=0)
    rng = x.amax(1, keepdim=True) - lo
    best_s, best_m = rng / nmax, -lo
    best_err = torch.full_like(lo, float("inf"))
    for t in _CANDIDATES:
        s0 = rng / (nmax + t)
        q = torch.round((x - lo) / torch.where(s0 > 0, s0, torch.ones_like(s0))).clamp(0, nmax)
        s, m = _lstsq_affine(x, q)
        err = ((s * q - m - x) ** 2).sum(1, keepdim=True)
        better = err < best_err
        best_s, best_m, best_err = torch.where(better, s, best_s), torch.where(better, m, best_m), \
            torch.where(better, err, best_err)
    return best_s, best_m


def _fit_symmetric(x: torch.Tensor, nneg: int) -> torch.Tensor:
    """Sub-blocks [n, L] -> signed scale [n, 1] for codes -nneg..nneg-1."""
    amax = x.gather(1, x.abs().argmax(1, keepdim=True))
    best_s = amax / -nneg
    best_err = torch.full_like(amax, float("inf"))
    for t in _CANDIDATES:
        s0 = amax / -(nneg + t)
        q = torch.round(x / torch.where(s0 != 0, s0, torch.ones_like(s0))).clamp(-nneg, nneg - 1)
        qq = (q * q).sum(1, keepdim=True)
        s = torch.where(qq > 0, (q * x).sum(1, keepdim=True) / torch.where(qq > 0, qq, torch.ones_like(qq)),
                        torch.zeros_like(qq))
        err = ((s * q - x) ** 2).sum(1, keepdim=True)
        better = err < best_err
        best_s, best_err = torch.where(better, s, best_s), torch.where(better, err, best_err)
    return best_s


def _f16(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [n, 1] -> (its float16 value as float32, its bytes [n, 2])."""
    h = v.to(torch.float16)
    return h.float(), h.view(torch.uint8).reshape(-1, 2)


def _codes(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor:
    """Integer codes of x [n, S, L] for w = scale*q - offset ([n, S, 1] each), clamped to [lo, hi]."""
    y = x if offset is None else x + offset
    q = torch.round(y / torch.where(scale != 0, scale, torch.ones_like(scale)))
    return torch.where(scale != 0, q, torch.zeros_like(q)).clamp(lo, hi).to(torch.int32)


def _super_affine(x: torch.Tensor, sub: int, nmax: int, smax: int):
    """Affine super-blocks: x [n, 256] -> (codes [n, 256], sc [n, S], m [n, S], d bytes, dmin bytes)."""
    n = x.shape[0]
    xs = x.reshape(-1, sub)
    s, m = _fit_affine(xs, nmax)
    s, m = s.reshape(n, -1), m.reshape(n, -1)                                       # [n, S]
    d, d_b = _f16(s.amax(1, keepdim=True) / smax)
    dmin, dmin_b = _f16(m.amax(1, keepdim=True) / smax)
    sc = torch.round(s / torch.where(d > 0, d, torch.ones_like(d))).clamp(0, smax)
    mn = torch.round(m / torch.where(dmin > 0, dmin, torch.ones_like(dmin))).clamp(0, smax)
    q = _codes(x.reshape(n, -1, sub), (d * sc)[..., None], (dmin * mn)[..., None], 0, nmax)
    return q.reshape(n, 256), sc.to(torch.int32), mn.to(torch.int32), d_b, dmin_b


def _super_symmetric(x: torch.Tensor, sub: int, nneg: int, sneg: int):
    """Symmetric super-blocks: x [n, 256] -> (codes [n, 256], signed sc [n, S], d bytes)."""
    n = x.shape[0]
    s = _fit_symmetric(x.reshape(-1, sub), nneg).reshape(n, -1)                   # [n, S]
    d, d_b = _f16(s.gather(1, s.abs().argmax(1, keepdim=True)) / -sneg)
    sc = torch.round(s / torch.where(d != 0, d, torch.ones_like(d))).clamp(-sneg, sneg - 1)
    q = _codes(x.reshape(n, -1, sub), (d * sc)[..., None], None, -nneg, nneg - 1)
    return q.reshape(n, 256), sc.to(torch.int32), d_b


def _or_shifted(parts: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, P, B] small ints -> [n, B] bytes: part p shifted left by p * bits."""
    sh = torch.arange(parts.shape[1], device=parts.device, dtype=torch.int32).reshape(1, -1, 1) * bits
    return (parts << sh).sum(1).to(torch.uint8)


def _q2_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    q, sc, mn, d_b, dmin_b = _super_affine(x, 16, 3, 15)
    scales = (sc | (mn << 4)).to(torch.uint8)                                       # [n, 16]
    qs = _or_shifted(q.reshape(n * 2, 4, 32), 2).reshape(n, 64)       # element h*128 + s*32 + l
    return torch.cat([scales, qs, d_b, dmin_b], dim=1)


def _q3_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    q, sc, d_b = _super_symmetric(x, 16, 4, 32)
    u = q + 4                                                                        # 0..7
    hmask = _or_shifted((u >> 2).reshape(n, 8, 32), 1)                   # bit i of byte l: element 32i + l
    qs = _or_shifted((u & 3).reshape(n * 2, 4, 32), 2).reshape(n, 64)
    v = sc + 32                                                                       # 6 bits each
    low = (v[:, 0:8] & 0x0F) | ((v[:, 8:16] & 0x0F) << 4)
    high = _or_shifted((v >> 4).reshape(n, 4, 4), 2)             # scale k: byte 8 + k % 4, bits 2 * (k // 4)
    return torch.cat([hmask, qs, low.to(torch.uint8), high, d_b], dim=1)


def _scales_k4(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins -> the 12 bytes Q4_K / Q5_K store them in."""
    a = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    b = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    c = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return torch.cat([a, b, c], dim=1).to(torch.uint8)


def _q4_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    q, sc, mn, d_b, dmin_b = _super_affine(x, 32, 15, 63)
    qs = _or_shifted(q.reshape(n * 4, 2, 32), 4).reshape(n, 128)      # byte 32c + l: elements 64c + l, +32
    return torch.cat([d_b, dmin_b, _scales_k4(sc, mn), qs], dim=1)


def _q5_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    q, sc, mn, d_b, dmin_b = _super_affine(x, 32, 31, 63)
    qh = _or_shifted((q >> 4).reshape(n, 8, 32), 1)
    qs = _or_shifted((q & 0x0F).reshape(n * 4, 2, 32), 4).reshape(n, 128)
    return torch.cat([d_b, dmin_b, _scales_k4(sc, mn), qh, qs], dim=1)


def _q6_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    q, sc, d_b = _super_symmetric(x, 16, 32, 128)
    u = (q + 32).reshape(n, 2, 4, 32)                                  # [h, s, l]: element 128h + 32s + l
    ql = ((u[:, :, 0:2] & 0x0F) | ((u[:, :, 2:4] & 0x0F) << 4)).reshape(n, 128).to(torch.uint8)
    qh = _or_shifted((u >> 4).reshape(n * 2, 4, 32), 2).reshape(n, 64)
    return torch.cat([ql, qh, sc.to(torch.int8).view(torch.uint8), d_b], dim=1)


# ------------------------------------------------------------------ IQ4_NL / IQ4_XS (non-linear 4-bit codes)
def _iq4_table(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """IQ4's 16 values (sorted) and the 15 midpoints between them."""
    v = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=device)
    return v, (v[1:] + v[:-1]) / 2


def _iq4_fit(x: torch.Tensor) -> torch.Tensor:
    """Blocks [n, 32] -> the scale d [n, 1] whose codes (each element's nearest table value of x / d) give
    the least squared error, as llama.cpp searches it: the block's largest-magnitude element mapped to
    table levels -127 + t (t = -7..7), each followed by the least-squares d of the codes it gives."""
    v, mid = _iq4_table(x.device)
    amax = x.gather(1, x.abs().argmax(1, keepdim=True))
    safe = torch.where(amax != 0, amax, torch.ones_like(amax))
    best_d, best = torch.zeros_like(amax), torch.zeros_like(amax)
    for t in range(-7, 8):
        q = v[torch.bucketize(x * ((t + v[0]) / safe), mid)]
        sqx, sqq = (q * x).sum(1, keepdim=True), (q * q).sum(1, keepdim=True)
        d = sqx / sqq
        better = (d * sqx > best) & (amax != 0)
        best_d, best = torch.where(better, d, best_d), torch.where(better, d * sqx, best)
    return best_d


def _iq4_codes(x: torch.Tensor, dl: torch.Tensor) -> torch.Tensor:
    """Blocks [n, 32] and their stored scales [n, 1] -> the nibble bytes [n, 16] (element j low, 16 + j high)."""
    return _pack_nibbles(torch.bucketize(x / torch.where(dl != 0, dl, torch.ones_like(dl)), _iq4_table(x.device)[1]))


def _iq4_nl(x: torch.Tensor) -> torch.Tensor:
    d, d_b = _f16(_iq4_fit(x))
    return torch.cat([d_b, _iq4_codes(x, d)], dim=1)


def _iq4_xs(x: torch.Tensor) -> torch.Tensor:
    """Super-blocks [n, 256]: eight blocks' scales, then d = -(the largest-magnitude scale) / 32 and each
    block's 6-bit ls = round(scale / d) + 32 (-32..31 stored as 0..63), the codes from d * (ls - 32)."""
    n = x.shape[0]
    b = x.reshape(n * 8, 32)
    sc = _iq4_fit(b).reshape(n, 8)
    mx = sc.gather(1, sc.abs().argmax(1, keepdim=True))
    d, d_b = _f16(-mx / 32)
    l = torch.round(sc / torch.where(d != 0, d, torch.ones_like(d))).clamp(-32, 31).to(torch.int32) + 32
    codes = _iq4_codes(b, (d * (l - 32).float()).reshape(n * 8, 1)).reshape(n, 128)
    sh = ((l >> 4) << (2 * torch.arange(8, device=x.device, dtype=torch.int32))).sum(1, keepdim=True)   # u16
    lo = ((l & 0x0F).reshape(n, 4, 2) << torch.tensor([0, 4], device=x.device, dtype=torch.int32)).sum(2)
    return torch.cat([d_b, (sh & 0xFF).to(torch.uint8), (sh >> 8).to(torch.uint8), lo.to(torch.uint8), codes], dim=1)


KQUANTIZERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "q2_k": _q2_k, "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k, "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs}
