"""Hand-written Triton kernels for the row-wise ops of a transformer block.

Each launcher takes torch tensors (CUDA, or CPU under ``TRITON_INTERPRET=1``), allocates its outputs
with ``torch.empty`` (inside a CUDA graph capture that memory comes from the engine's graph pool) and
returns them. Arithmetic is float32; results are rounded once to the output dtype.

    rms_norm(x, w, eps)                    y = x * rsqrt(mean(x^2) + eps) * w          rows of the last dim
    skip_rms_norm(x, skip, w, eps)         s = x + skip; y = rms_norm(s)  -> (y, s)
    layer_norm(x, w, b, eps)               y = (x - mean) * rsqrt(var + eps) * w + b
    softmax(x)                             over the last dim
    silu_mul(gate, up)                     silu(gate) * up  (or one tensor: its two halves)
    rope(x, cos, sin, interleaved)         rotate pairs of the last dim; cos/sin broadcast to x[..., :D/2]

Rows are the leading dims flattened: the last dim must be contiguous (stride 1), rows evenly strided
(``_rows`` makes a 2-D view, copying only when the layout forbids one).
"""
from __future__ import annotations

import torch

from shapeplan.runtime.backends.triton.env import triton   # before the kernels: Triton's cache under ours
from shapeplan.runtime.backends.triton.kernels.rows_jit import (_cache_write_kv_kernel, _layer_norm_kernel,
                                                               _rms_norm_kernel, _rope_kernel, _silu_mul_kernel,
                                                               _softmax_kernel)

_MAX_ROW = 65536        # one row per program: beyond this a row no longer fits a block


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(block: int) -> int:
    return 1 if block <= 256 else 2 if block <= 1024 else 4 if block <= 4096 else 8


def _rows(x: torch.Tensor) -> torch.Tensor:
    """A [rows, N] view of ``x`` with a unit stride on N."""
    n = x.shape[-1] if x.dim() else 1
    if x.dim() == 0:
        return x.reshape(1, 1)
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return x.view(-1, n)
    except RuntimeError:
        return x.contiguous().view(-1, n)


def supports_rows(x: torch.Tensor) -> bool:
    return x.dim() >= 1 and 0 < x.shape[-1] <= _MAX_ROW and x.dtype in (torch.float16, torch.bfloat16,
                                                                         torch.float32)


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float,
             skip: torch.Tensor | None = None, out: torch.Tensor | None = None,
             sum_out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """RMSNorm over the last dim. With ``skip``: returns (norm(x + skip), x + skip)."""
    shape, n = x.shape, x.shape[-1]
    x2 = _rows(x)                                              # [R, N]
    s2 = _rows(skip.expand(shape)) if skip is not None else x2
    y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, n)
    sm = y if skip is None else sum_out if sum_out is not None else torch.empty(shape, dtype=x.dtype,
                                                                                 device=x.device)
    sm2 = sm.view(-1, n)
    wc = w.contiguous() if w is not None else x2
    block = _next_pow2(n)
    _rms_norm_kernel[(x2.shape[0],)](x2, s2, wc, y2, sm2, x2.stride(0), s2.stride(0), y2.stride(0),
                                     sm2.stride(0), n, float(eps), HAS_SKIP=skip is not None,
                                     HAS_W=w is not None, BLOCK=block, num_warps=_warps(block))
    return (y, sm) if skip is not None else (y,)


def layer_norm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, eps: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    shape, n = x.shape, x.shape[-1]
    x2 = _rows(x)
    y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, n)
    block = _next_pow2(n)
    _layer_norm_kernel[(x2.shape[0],)](x2, w.contiguous() if w is not None else x2,
                                       b.contiguous() if b is not None else x2, y2, x2.stride(0),
                                       y2.stride(0), n, float(eps), HAS_W=w is not None,
                                       HAS_B=b is not None, BLOCK=block, num_warps=_warps(block))
    return y


def softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim."""
    shape, n = x.shape, x.shape[-1]
    x2 = _rows(x)
    y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, n)
    block = _next_pow2(n)
    _softmax_kernel[(x2.shape[0],)](x2, y2, x2.stride(0), y2.stride(0), n, BLOCK=block,
                                    num_warps=_warps(block))
    return y


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of two shapes. Not torch.broadcast_shapes: its first call imports
    torch._refs -> sympy, 3.3 s of every process start on the H200 machine (issue 7 profile)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def silu_mul(gate: torch.Tensor, up: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up; with one tensor, gate and up are its first and second half (last dim)."""
    if up is None:
        n = gate.shape[-1] // 2
        g2 = _rows(gate)
        u2 = g2[:, n:]
        g2 = g2[:, :n]
        shape = (*gate.shape[:-1], n)
    else:
        shape = _broadcast(tuple(gate.shape), tuple(up.shape))
        n = shape[-1]
        g2, u2 = _rows(gate.expand(shape)), _rows(up.expand(shape))
    y = out if out is not None else torch.empty(shape, dtype=gate.dtype, device=gate.device)
    y2 = y.view(-1, n)
    block = min(1024, _next_pow2(n))
    grid = (g2.shape[0], triton.cdiv(n, block))
    _silu_mul_kernel[grid](g2, u2, y2, g2.stride(0), u2.stride(0), y2.stride(0), n, BLOCK=block,
                           num_warps=_warps(block))
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
         positions: torch.Tensor | None = None, pos_strides: tuple[int, int, int] = (0, 0, 0),
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding over the whole last dim D of ``x`` ([A0, A1, A2, D]; lower ranks are padded).

    Without ``positions``: ``cos``/``sin`` broadcast to ``x.shape[:-1] + (D/2,)``. With ``positions``:
    ``cos``/``sin`` are caches [max_pos, D/2] and row (i0, i1, i2) reads position
    ``positions.flatten()[i0*ps0 + i1*ps1 + i2*ps2]`` (``pos_strides`` in elements).
    Rotate-half pairs (j, j + D/2), or with ``interleaved`` pairs (2j, 2j + 1).
    """
    d = x.shape[-1]
    half = d // 2
    lead = tuple(x.shape[:-1])
    if len(lead) > 3:
        raise ValueError(f"rope: rank {x.dim()} > 4 is not supported")
    a = (1,) * (3 - len(lead)) + lead                         # [A0, A1, A2]
    if x.stride(-1) != 1:
        x = x.contiguous()
    xv = x.view(*a, d) if x.dim() == 4 else x.reshape(*a, d)
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    yv = y.view(*a, d) if y.dim() == 4 else y.reshape(*a, d)
    if positions is not None:
        cv, sv = cos.contiguous(), sin.contiguous()
        cs = (cv.stride(0), 0, 0)
        pv = positions.contiguous()
    else:
        cv = cos.expand(*lead, half).reshape(*a, half)
        sv = sin.expand(*lead, half).reshape(*a, half)
        if cv.stride() != sv.stride() or cv.stride(-1) != 1:
            cv, sv = cv.contiguous(), sv.contiguous()
        cs = cv.stride()[:3]
        pv = cv
    block = _next_pow2(half)
    rows = a[0] * a[1] * a[2]
    _rope_kernel[(rows,)](xv, cv, sv, pv, yv, a[1], a[2], *xv.stride()[:3], *yv.stride()[:3], *cs,
                          *pos_strides, half, HAS_POS=positions is not None, INTERLEAVED=bool(interleaved),
                          BLOCK=block, num_warps=_warps(block))
    return y


def cache_write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   position: torch.Tensor, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
                   interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's K and V rows ([B, H, 1, D]) into the caches ([B, H, L, D]) at the device-resident
    ``position`` (one element), in one launch; with ``cos``/``sin`` ([B, 1, D/2], equal strides) ``k`` is
    rotated on the way (RotaryEmbedding). Last dims contiguous (checked by the lowering)."""
    b, h, length, d = k_cache.shape
    block, rotate = _next_pow2(d), cos is not None
    c, s = (cos, sin) if rotate else (k, k)
    _cache_write_kv_kernel[(b * h,)](k, v, k_cache, v_cache, position, c, s, h, length, k.stride(0), k.stride(1),
                                     v.stride(0), v.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
                                     c.stride(0), d, d // 2, ROTATE=rotate, INTERLEAVED=bool(interleaved),
                                     BLOCK=block, BLOCK_H=max(1, _next_pow2(d // 2)), num_warps=_warps(block))
    return k_cache, v_cache
