"""Split-K ("flash-decoding") attention for one decode step over a static KV cache, in Triton.

SDPA over the static cache reads all L positions every step; this kernel reads the device-resident
position and touches only the live keys ``[max(0, pos - window + 1), pos]``, so its cost follows the
context length, not the buffer length. Nothing is read on the host, so it captures into CUDA graphs.

Pass 1, grid (B * Hkv, L / SPLIT): each program takes one KV head and one SPLIT-key chunk, holds the
G = Hq / Hkv query heads of the group, and writes an online-softmax partial (max, sum, acc). Chunks
past the position exit at once. Pass 2, grid (B * Hkv,): merges the partials of each head group.
Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests).

Tuning (``configure`` or ``SHAPEPLAN_LLM_DECODE_ATTENTION=MODE:split,warps,dot``): SPLIT keys per program, warps of
pass 1, and ``dot`` = the q.k and p.v products on the tensor cores (``tl.dot``, the G query rows
padded to 16; p rounded to the cache dtype as flash attention does) instead of broadcast-multiply-sum.
"""
from __future__ import annotations

import torch

from shapeplan import env
from shapeplan.runtime.backends.triton.env import triton   # before the kernels: Triton's cache under ours
from shapeplan.runtime.backends.triton.kernels.decode_attention_jit import _combine, _partial

SPLIT = 0                # keys per program; 0 = auto: 16, or L / 64 for caches over 1,024 (combine <= 64 rows)
WARPS = 2                # auto / 2 / no dot: fastest in bench/decode_attention.py on the H200 (7.1 us
DOT = False              # per llama-1b layer at position 256, vs 10.4 for the first 64 / 4 version)
MAX_TILE = 8192          # elements of the [G, BLOCK_N, D] product a program holds (register budget)


def configure(split: int | None = None, warps: int | None = None, dot: bool | None = None) -> tuple:
    """Set the kernel's tuning (see the module doc); returns the previous (split, warps, dot)."""
    global SPLIT, WARPS, DOT
    old = (SPLIT, WARPS, DOT)
    SPLIT = SPLIT if split is None else split
    WARPS = warps or WARPS
    DOT = DOT if dot is None else dot
    return old


_tuning = env.get("SHAPEPLAN_LLM_DECODE_ATTENTION")[1]      # MODE:split,warps,dot (read once, at import)
if _tuning is not None:
    configure(*_tuning)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor,
                     *, scale: float, window: int = 0, only: str | None = None,
                     compile_only: bool = False) -> torch.Tensor | None:
    """q [B, Hq, 1, D]; k/v_cache [B, Hkv, L, D] (last dim contiguous); position int64 [1] (device).
    Returns [B, Hq, 1, D] in q's dtype: softmax(q k^T * scale) v over the live keys only.
    ``only="partial"|"combine"`` launches one pass alone (start-up warm-up: each compiles on its own);
    ``compile_only`` compiles without touching the device (no allocation, no launch: safe beside a CUDA
    graph capture on another thread) and returns None."""
    b, hq, s, d = q.shape
    hkv, length = k_cache.shape[1], k_cache.shape[2]
    assert s == 1 and q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    g = hq // hkv
    dot = DOT and q.dtype == k_cache.dtype == v_cache.dtype
    gp, dp = max(_pow2(g), 16 if dot else 2), max(_pow2(d), 16 if dot else 1)
    split = SPLIT or max(16, _pow2(triton.cdiv(length, 64)))
    ns = triton.cdiv(length, split)
    bn = min(split, 64, max(16, MAX_TILE // (gp * dp))) if not dot else min(split, 64)
    if compile_only:
        from shapeplan.runtime.backends.triton.env import interpreting
        if interpreting():                 # the interpreter compiles nothing
            return None
        _compile_only(q, k_cache, v_cache, scale, window, only, hkv, g, gp, d, dp, ns, split, bn, dot)
        return None
    dev = q.device
    m = torch.empty(b * hkv * ns * gp, dtype=torch.float32, device=dev)
    l = torch.empty_like(m)
    acc = torch.empty(b * hkv * ns * gp * dp, dtype=torch.float32, device=dev)
    out = torch.empty(b, hq, 1, d, dtype=q.dtype, device=dev)
    if only != "combine":
        _partial[(b * hkv, ns)](q, k_cache, v_cache, position, m, l, acc,
                                q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), scale,
                                HKV=hkv, G=g, GP=gp, D=d, DP=dp, NS=ns, SPLIT_=split, BN=bn, WINDOW=window,
                                USE_DOT=dot, IEEE=q.dtype == torch.float32, num_warps=WARPS)
    if only != "partial":
        _combine[(b * hkv,)](m, l, acc, out, out.stride(0), out.stride(1),
                             HKV=hkv, G=g, GP=gp, D=d, DP=dp, NS=ns, NSP=max(_pow2(ns), 2))
    return out


def _compile_only(q, k_cache, v_cache, scale, window, only, hkv, g, gp, d, dp, ns, split, bn, dot) -> None:  # noqa: ANN001
    """Both passes through Triton's ``warmup`` (compile, no launch) with torch dtypes standing in for the
    tensors (Triton reads them as 16-byte aligned): the specialization of a launch on aligned tensors
    with these strides."""
    f32, qt, kt, vt = torch.float32, q.dtype, k_cache.dtype, v_cache.dtype
    b = q.shape[0]
    if only != "combine":
        _partial.warmup(qt, kt, vt, torch.int64, f32, f32, f32,
                        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), scale,
                        HKV=hkv, G=g, GP=gp, D=d, DP=dp, NS=ns, SPLIT_=split, BN=bn, WINDOW=window,
                        USE_DOT=dot, IEEE=q.dtype == torch.float32, num_warps=WARPS, grid=(b * hkv, ns))
    if only != "partial":
        hq = q.shape[1]
        _combine.warmup(f32, f32, f32, qt, hq * d, d,
                        HKV=hkv, G=g, GP=gp, D=d, DP=dp, NS=ns, NSP=max(_pow2(ns), 2), grid=(b * hkv,))
