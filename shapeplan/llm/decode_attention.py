"""Split-K ("flash-decoding") attention for one decode step over a static KV cache, in Triton.

SDPA over the static cache reads all L positions every step; this kernel reads the device-resident
position and touches only the live keys ``[max(0, pos - window + 1), pos]``, so its cost follows the
context length, not the buffer length. Nothing is read on the host, so it captures into CUDA graphs.

Pass 1, grid (B * Hkv, L / SPLIT): each program takes one KV head and one SPLIT-key chunk, holds the
G = Hq / Hkv query heads of the group, and writes an online-softmax partial (max, sum, acc). Chunks
past the position exit at once. Pass 2, grid (B * Hkv,): merges the partials of each head group.
Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests).

Tuning (``configure`` or ``SHAPEPLAN_DECODE_ATTN=split,warps,dot``): SPLIT keys per program, warps of
pass 1, and ``dot`` = the q.k and p.v products on the tensor cores (``tl.dot``, the G query rows
padded to 16; p rounded to the cache dtype as flash attention does) instead of broadcast-multiply-sum.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

SPLIT = 0                # keys per program; 0 = auto: 16, or L / 64 for caches over 1,024 (combine <= 64 rows)
WARPS = 2                # auto / 2 / no dot: fastest in bench/gpu_decode_attention.py on the H200 (7.1 us
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


if os.environ.get("SHAPEPLAN_DECODE_ATTN"):
    _s, _w, _d = os.environ["SHAPEPLAN_DECODE_ATTN"].split(",")
    configure(int(_s), int(_w), _d.strip().lower() in ("1", "true", "dot"))


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr,
             sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, scale,
             HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
             NS: tl.constexpr, SPLIT_: tl.constexpr, BN: tl.constexpr, WINDOW: tl.constexpr,
             USE_DOT: tl.constexpr, IEEE: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // HKV
    h = pid_bh % HKV
    pos = tl.load(pos_ptr)
    end = pos + 1                                         # keys 0..pos are live
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(pos - WINDOW + 1, 0)
    start = tl.maximum(pid_s * SPLIT_, lo)
    stop = tl.minimum(pid_s * SPLIT_ + SPLIT_, end)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    gmask = g < G
    dmask = d < D
    q = tl.load(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)                       # [GP, DP]
    if not USE_DOT:
        q = q.to(tl.float32)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    for n in range(start, stop, BN):
        offs = n + tl.arange(0, BN)
        valid = offs < stop
        kv_mask = valid[:, None] & dmask[None, :]
        k = tl.load(k_ptr + b * sk_b + h * sk_h + offs[:, None] * sk_l + d[None, :], mask=kv_mask,
                    other=0.0)                                                          # [BN, DP]
        v = tl.load(v_ptr + b * sv_b + h * sv_h + offs[:, None] * sv_l + d[None, :], mask=kv_mask,
                    other=0.0)
        if USE_DOT:
            if IEEE:
                s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * scale  # [GP, BN]
            else:
                s = tl.dot(q, tl.trans(k.to(q.dtype))) * scale
        else:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                   # [GP, BN]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
        else:
            pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    base = (pid_bh * NS + pid_s) * GP
    tl.store(m_ptr + base + g, m_i)
    tl.store(l_ptr + base + g, l_i)
    tl.store(acc_ptr + (base + g)[:, None] * DP + d[None, :], acc)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, o_ptr, so_b, so_h,
             HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
             NS: tl.constexpr, NSP: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = pid_bh // HKV
    h = pid_bh % HKV
    s = tl.arange(0, NSP)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    smask = s < NS
    idx = (pid_bh * NS + s[:, None]) * GP + g[None, :]                                # [NSP, GP]
    m = tl.load(m_ptr + idx, mask=smask[:, None], other=float("-inf"))
    l = tl.load(l_ptr + idx, mask=smask[:, None], other=0.0)
    acc = tl.load(acc_ptr + idx[:, :, None] * DP + d[None, None, :], mask=smask[:, None, None], other=0.0)
    mx = tl.max(m, axis=0)                                                            # [GP]
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx[None, :]))                    # empty chunks weigh 0
    den = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, :, None] * acc, axis=0) / den[:, None]                          # [GP, DP]
    tl.store(o_ptr + b * so_b + (h * G + g)[:, None] * so_h + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(g < G)[:, None] & (d < D)[None, :])


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor,
                     *, scale: float, window: int = 0) -> torch.Tensor:
    """q [B, Hq, 1, D]; k/v_cache [B, Hkv, L, D] (last dim contiguous); position int64 [1] (device).
    Returns [B, Hq, 1, D] in q's dtype: softmax(q k^T * scale) v over the live keys only."""
    b, hq, s, d = q.shape
    hkv, length = k_cache.shape[1], k_cache.shape[2]
    assert s == 1 and q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    g = hq // hkv
    dot = DOT and q.dtype == k_cache.dtype == v_cache.dtype
    gp, dp = max(_pow2(g), 16 if dot else 2), max(_pow2(d), 16 if dot else 1)
    split = SPLIT or max(16, _pow2(triton.cdiv(length, 64)))
    ns = triton.cdiv(length, split)
    bn = min(split, 64, max(16, MAX_TILE // (gp * dp))) if not dot else min(split, 64)
    dev = q.device
    m = torch.empty(b * hkv * ns * gp, dtype=torch.float32, device=dev)
    l = torch.empty_like(m)
    acc = torch.empty(b * hkv * ns * gp * dp, dtype=torch.float32, device=dev)
    out = torch.empty(b, hq, 1, d, dtype=q.dtype, device=dev)
    _partial[(b * hkv, ns)](q, k_cache, v_cache, position, m, l, acc,
                            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), scale,
                            HKV=hkv, G=g, GP=gp, D=d, DP=dp, NS=ns, SPLIT_=split, BN=bn, WINDOW=window,
                            USE_DOT=dot, IEEE=q.dtype == torch.float32, num_warps=WARPS)
    _combine[(b * hkv,)](m, l, acc, out, out.stride(0), out.stride(1),
                         HKV=hkv, G=g, GP=gp, D=d, DP=dp, NS=ns, NSP=max(_pow2(ns), 2))
    return out
