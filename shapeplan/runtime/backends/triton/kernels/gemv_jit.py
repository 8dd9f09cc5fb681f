"""The decode GEMV Triton kernel of ``gemv`` (its launcher is there).

This module imports Triton and nothing else (no torch, no shapeplan), so a compile worker process
(``../compile_worker.py``) can load it by path in the time of a Triton import.
"""

import triton
import triton.language as tl

try:                                       # grid dependency control (Hopper+): Triton 3.3 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_GDC = True
except ImportError:                        # then PDL stays off (the launcher asks HAS_GDC)
    gdc_launch_dependents = gdc_wait = None
    HAS_GDC = False


@triton.jit
def _gemv_kernel(X, NW, W, R, Y, N, K, HALF, stride_wn, eps,
                 BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr,
                 EVEN_K: tl.constexpr, PDL: tl.constexpr = False, PF: tl.constexpr = 0):
    """Y[n] = epilogue(sum_k prologue(X)[k] * W[n, k]) for the BN outputs n of this program (one row x).

    NORM: RMSNorm of x with weight NW, in one pass: rstd = rsqrt(mean(x^2) + eps) is a common factor of
    the row, so the loop sums x^2 beside the products of x * NW and scales once at the end (x is read
    once; the normalized x is not rounded to X's dtype, as the unfused RMSNormalization would).
    GLU: silu(gate) * up with gate = row n, up = row n + HALF of W, each rounded to Y's dtype first (as
    MatMul + SiluMul round). RES: + R[n], the product rounded first (as MatMul + Add). Products are
    accumulated elementwise in float32 and summed once after the loop; ``_finish`` is the epilogue.
    PDL (launched with programmatic dependent launch): let the next kernel launch at once, load the
    first weight tile (a constant) while the kernel before this one finishes, and wait for that kernel
    only before the first read of x, R or NW's product (``gdc_wait``: everything before it is complete).
    PF (with PDL; lines of 128 bytes a program, 0: off): before that wait, programs 0, 1, .. ask L2 for the
    whole of W, PF lines each (``_prefetch_l2``), so that a GEMV after a kernel that leaves memory idle (the
    decode attention before the o projection) finds its weight in L2 when x is ready."""
    pid = tl.program_id(0)
    cols = pid * BN + tl.arange(0, BN)
    col_ok = cols < N
    ks = tl.arange(0, BK)
    wp = W + cols[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    acc_u = tl.zeros([BN, BK], dtype=tl.float32)        # (unused without GLU: the compiler drops it)
    ss = tl.zeros([BK], dtype=tl.float32)               # (unused without NORM)
    if PDL:
        gdc_launch_dependents()
    w, wu = _tile(wp, ks, col_ok, K, HALF * stride_wn, GLU, EVEN_K)                 # the first tile
    if PF:
        row_bytes = stride_wn.to(tl.int64) * (W.dtype.element_ty.primitive_bitwidth // 8)
        _prefetch_l2(W, pid, tl.cdiv(N * row_bytes, 128), PF)
    if PDL:
        gdc_wait()
    acc, acc_u, ss = _step(acc, acc_u, ss, w, wu, X, NW, ks, K, NORM, GLU, EVEN_K)
    for k0 in range(BK, K, BK):
        kk = k0 + ks
        w, wu = _tile(wp, kk, col_ok, K, HALF * stride_wn, GLU, EVEN_K)
        acc, acc_u, ss = _step(acc, acc_u, ss, w, wu, X, NW, kk, K, NORM, GLU, EVEN_K)
    y = tl.sum(acc, axis=1)                                                         # [BN]
    u = y
    if GLU:
        u = tl.sum(acc_u, axis=1)
    total = 0.0
    if NORM:
        total = tl.sum(ss, axis=0)
    _finish(y, u, total, K, eps, R, Y, cols, col_ok, NORM, RES, GLU)


@triton.jit
def _prefetch_l2(W, pid, lines, PF: tl.constexpr):
    """Program ``pid``'s share of W's first ``lines`` 128-byte lines, PF of them, asked of L2
    (``prefetch.global.L2``: no registers held, nothing waited for); programs past the last line ask for nothing."""
    if pid * PF < lines:
        line = tl.minimum(pid * PF + tl.arange(0, PF), lines - 1).to(tl.int64)   # (the last line again: in bounds)
        base = W.to(tl.pointer_type(tl.int8), bitcast=True)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [base + line * 128],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _tile(wp, kk, col_ok, K, up_offset, GLU: tl.constexpr, EVEN_K: tl.constexpr):
    """The weight tile [BN, BK] at columns kk (and the up rows' with GLU, else the same tile again)."""
    if EVEN_K:
        wmask = col_ok[:, None]
    else:
        wmask = col_ok[:, None] & (kk[None, :] < K)
    w = tl.load(wp + kk[None, :], mask=wmask, other=0.0)
    wu = w
    if GLU:
        wu = tl.load(wp + up_offset + kk[None, :], mask=wmask, other=0.0)
    return w, wu


@triton.jit
def _step(acc, acc_u, ss, w, wu, X, NW, kk, K, NORM: tl.constexpr, GLU: tl.constexpr, EVEN_K: tl.constexpr):
    """One K tile: x's slice (times the norm weight, its squares summed), products into the accumulators."""
    if EVEN_K:
        xk = tl.load(X + kk).to(tl.float32)
    else:
        xk = tl.load(X + kk, mask=kk < K, other=0.0).to(tl.float32)
    if NORM:
        ss += xk * xk
        xk = xk * tl.load(NW + kk, mask=kk < K, other=0.0).to(tl.float32)
    acc += w.to(tl.float32) * xk[None, :]
    if GLU:
        acc_u += wu.to(tl.float32) * xk[None, :]
    return acc, acc_u, ss


@triton.jit
def _finish(y, u, ss, K, eps, R, Y, rows, ok, NORM: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr):
    """The decode GEMVs' epilogue (this kernel's and the quantized ones' in qgemv.py): the norm's scale
    rsqrt(ss / K + eps), rounding to Y's dtype where the unfused ops round, the SiLU gate, the residual,
    the store of rows ``rows``."""
    if NORM:
        rstd = tl.math.rsqrt(ss / K + eps)
        y = y * rstd
        u = u * rstd
    y = y.to(Y.dtype.element_ty).to(tl.float32)
    if GLU:
        u = u.to(Y.dtype.element_ty).to(tl.float32)
        y = (y * tl.sigmoid(y)).to(Y.dtype.element_ty).to(tl.float32) * u
    if RES:
        y += tl.load(R + rows, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=ok)
