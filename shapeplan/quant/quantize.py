"""Quantization of float weights into packed blocks, in torch (any device; on a GPU a model takes
seconds): the simple types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and their group-64/128 forms INT4_G* / INT8_G*)
here, the K-quants in ``shapeplan/quant/kquants.py``.

The simple types follow the rounding of llama.cpp's reference quantizers as gguf-py transcribes them
(``gguf.quants.quantize``), so their bytes equal gguf-py's (tests/quant/test_quantize.py); INT8_G* and
INT4_G* are the same rules as Q8_0 and Q4_1 over a larger group.
"""
from __future__ import annotations

import torch

from shapeplan.errors import InputError
from shapeplan.quant.formats import QTYPES, REPACKED, QuantWeight, qtype, repack

#: elements per chunk of rows quantized at once (bounds the temporaries of the K-quant searches)
CHUNK_ELEMENTS = 1 << 22


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    """float32 [n, 1] -> its float16 bytes [n, 2]."""
    return v.to(torch.float16).view(torch.uint8).reshape(-1, 2)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[n, G] values 0..15 -> [n, G/2] bytes: element j low, element j + G/2 high."""
    h = q.shape[1] // 2
    return (q[:, :h] | (q[:, h:] << 4)).to(torch.uint8)


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (C's roundf), without the ``floor(|x| + 0.5)`` float32 error just
    below one half."""
    a = x.abs()
    f = torch.floor(a)
    return torch.sign(x) * (f + torch.floor(2 * (a - f)))


def _int8(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=1, keepdim=True) / 127
    q = _roundf(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d), q], dim=1)


def _int4(x: torch.Tensor) -> torch.Tensor:
    hi, lo = x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).to(torch.uint8).clamp(0, 15)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], dim=1)


def _signed_max(x: torch.Tensor) -> torch.Tensor:
    """The element of largest magnitude of each row (the first one on ties), sign kept: [n, 1]."""
    return x.gather(1, x.abs().argmax(dim=1, keepdim=True))


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_max(x) / -8
    q = torch.trunc(x * _inverse(d) + 8.5).to(torch.uint8).clamp(0, 15)
    return torch.cat([_f16_bytes(d), _pack_nibbles(q)], dim=1)


def _high_bits(q: torch.Tensor) -> torch.Tensor:
    """[n, 32] values 0..31 -> the little-endian uint32 of their bit 4, as [n, 4] bytes."""
    bits = ((q >> 4) & 1).reshape(-1, 4, 8).to(torch.int32)
    return (bits << torch.arange(8, device=q.device, dtype=torch.int32)).sum(-1).to(torch.uint8)


def _q5_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_max(x) / -16
    q = torch.trunc(x * _inverse(d) + 16.5).to(torch.uint8).clamp(0, 31)
    return torch.cat([_f16_bytes(d), _high_bits(q), _pack_nibbles(q & 0x0F)], dim=1)


def _q5_1(x: torch.Tensor) -> torch.Tensor:
    hi, lo = x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True)
    d = (hi - lo) / 31
    q = torch.trunc((x - lo) * _inverse(d) + 0.5).to(torch.uint8).clamp(0, 31)
    return torch.cat([_f16_bytes(d), _f16_bytes(lo), _high_bits(q), _pack_nibbles(q & 0x0F)], dim=1)


_SIMPLE = {"int8": _int8, "int4": _int4, "q4_0": _q4_0, "q5_0": _q5_0, "q5_1": _q5_1}


def quantize(w: torch.Tensor, name: str, *, tensor: str = "<tensor>") -> torch.Tensor:
    """Float ``[N, K]`` -> packed uint8 ``[N, K // block * type_size]`` of type ``name`` (computed in
    float32 on ``w``'s device)."""
    q = qtype(name, tensor=tensor)
    if name in REPACKED:                        # a GGUF type's bytes in our layout (shapeplan/quant/formats.py)
        return repack(quantize(w, REPACKED[name][0], tensor=tensor), name)
    if w.dim() != 2 or w.shape[1] % q.block:
        raise InputError(f"tensor {tensor!r}: {name} needs a 2-D weight whose rows are a multiple of "
                         f"{q.block} elements, got shape {list(w.shape)}")
    if q.kind in _SIMPLE:
        fn = _SIMPLE[q.kind]
    else:
        from shapeplan.quant.kquants import KQUANTIZERS
        if q.kind not in KQUANTIZERS:
            raise InputError(f"tensor {tensor!r}: quantizing to {name} is not implemented (quantizers: "
                             f"{', '.join(n for n, t in QTYPES.items() if t.kind in _SIMPLE or t.kind in KQUANTIZERS)})")
        fn = KQUANTIZERS[q.kind]
    n, k = w.shape
    rows = max(1, CHUNK_ELEMENTS // k)
    out = torch.empty(n, q.row_bytes(k), dtype=torch.uint8, device=w.device)
    for r in range(0, n, rows):
        x = w[r:r + rows].to(torch.float32).reshape(-1, q.block)
        out[r:r + rows] = fn(x).reshape(-1, q.row_bytes(k))
    return out


def quantize_weight(w: torch.Tensor, name: str, *, tensor: str = "<tensor>") -> QuantWeight:
    return QuantWeight(quantize(w, name, tensor=tensor), name, (int(w.shape[0]), int(w.shape[1])))


def x_code_words(k: int) -> int:
    """int32 words of ``x_codes`` for K inputs: K / 4 code words, then K / 32 scales and K / 32 sums."""
    return k // 4 + k // 16


def x_codes(x: torch.Tensor) -> torch.Tensor:
    """An activation row x [K] (K a multiple of 32) as the one-row quantized GEMV reads x with int8 codes
    (kernels/qgemv.py, XQ = 2 / 3, llama.cpp's q8_1 idea): per block of 32 the codes round(x * 127 / max|x|)
    as signed bytes, four to an int32 word (element 4j + b in byte b of word j), then every block's scale
    max|x| / 127 and every block's exact sum as float32 bits; int32 [x_code_words(K)]. The torch form of
    qgemv.quantize_x (which the GPU runs; its division may round differently in the last bit)."""
    k = x.numel()
    if k % 32:
        raise InputError(f"x_codes: x has {k} elements, expected a multiple of 32")
    b = x.reshape(-1, 32).to(torch.float32)                                   # [K / 32, 32]
    amax = b.abs().amax(1)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))   # (not 127.0 / amax:
    # torch computes a number over a tensor as the reciprocal times the number, which rounds differently)
    q = torch.floor(b * inv[:, None] + 0.5).to(torch.int8)                    # -127 .. 127
    return torch.cat([q.reshape(-1).view(torch.int32), (amax / 127.0).view(torch.int32),
                      b.sum(1).view(torch.int32)])

