"""The row-wise Triton kernels of ``rows`` (their launchers are there).

This module imports Triton and nothing else (no torch, no shapeplan), so a compile worker process
(``../compile_worker.py``) can load it by path in the time of a Triton import.
"""

import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(X, S, W, Y, SUM, stride_x, stride_s, stride_y, stride_sum, N, eps,
                     HAS_SKIP: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_SKIP:
        x = x + tl.load(S + row * stride_s + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(SUM.dtype.element_ty)          # the residual sum is rounded like the unfused Add
        tl.store(SUM + row * stride_sum + cols, x, mask=mask)
        x = x.to(tl.float32)
    ms = tl.sum(x * x, axis=0) / N
    y = (x * tl.math.rsqrt(ms + eps)).to(Y.dtype.element_ty).to(tl.float32)   # torch rounds here
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_kernel(X, W, B, Y, stride_x, stride_y, N, eps,
                       HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / N
    y = (d * tl.math.rsqrt(var + eps)).to(Y.dtype.element_ty).to(tl.float32)
    if HAS_W:
        y = (y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)).to(Y.dtype.element_ty).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_kernel(X, Y, stride_x, stride_y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.where(mask, tl.exp(x), 0.0)
    y = e / tl.sum(e, axis=0)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(G, U, Y, stride_g, stride_u, stride_y, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    y = (g * tl.sigmoid(g)).to(Y.dtype.element_ty).to(tl.float32) * u
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


# A1, A2 and the position strides only index rows: not specializing them on ==1 / %16 lets the prefill and
# decode plans, and q and k (other head counts), share one compiled kernel (start-up: fewer compiles)
@triton.jit(do_not_specialize=["A1", "A2", "sp0", "sp1", "sp2"])
def _rope_kernel(X, C, S, P, Y, A1, A2, sx0, sx1, sx2, sy0, sy1, sy2, sc0, sc1, sc2, sp0, sp1, sp2,
                 HALF, HAS_POS: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)           # row index over [A0, A1, A2]
    i2 = r % A2
    i1 = (r // A2) % A1
    i0 = r // (A2 * A1)
    j = tl.arange(0, BLOCK)
    mask = j < HALF
    xb = X + i0 * sx0 + i1 * sx1 + i2 * sx2
    yb = Y + i0 * sy0 + i1 * sy1 + i2 * sy2
    if INTERLEAVED:
        lo, hi = 2 * j, 2 * j + 1
    else:
        lo, hi = j, j + HALF
    if HAS_POS:                                 # cos/sin caches [max_pos, HALF] gathered by position id
        p = tl.load(P + i0 * sp0 + i1 * sp1 + i2 * sp2).to(tl.int64)
        coff = p * sc0
        soff = p * sc0
    else:
        coff = i0 * sc0 + i1 * sc1 + i2 * sc2
        soff = coff
    c = tl.load(C + coff + j, mask=mask, other=0.0).to(Y.dtype.element_ty).to(tl.float32)
    s = tl.load(S + soff + j, mask=mask, other=0.0).to(Y.dtype.element_ty).to(tl.float32)
    x1 = tl.load(xb + lo, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xb + hi, mask=mask, other=0.0).to(tl.float32)
    # torch: real = cos*x1 - sin*x2 with each product rounded to x's dtype
    re = (c * x1).to(Y.dtype.element_ty).to(tl.float32) - (s * x2).to(Y.dtype.element_ty).to(tl.float32)
    im = (s * x1).to(Y.dtype.element_ty).to(tl.float32) + (c * x2).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(yb + lo, re.to(Y.dtype.element_ty), mask=mask)
    tl.store(yb + hi, im.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _cache_write_kv_kernel(K, V, KC, VC, P, C, S, H, L, sk0, sk1, sv0, sv1, skc0, skc1, skc2, svc0, svc1, svc2,
                           sc0, D, HALF, ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK: tl.constexpr,
                           BLOCK_H: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)           # one (batch, head) row: its K and V vectors of D
    h = r % H
    b = r // H
    p = tl.load(P).to(tl.int64)                 # the write position, read on the device
    ok = (p >= 0) & (p < L)                     # a position outside the cache writes nothing
    j = tl.arange(0, BLOCK)
    mask = j < tl.where(ok, D, 0)
    v = tl.load(V + b * sv0 + h * sv1 + j, mask=mask)
    tl.store(VC + b * svc0 + h * svc1 + p * svc2 + j, v.to(VC.dtype.element_ty), mask=mask)
    kb = K + b * sk0 + h * sk1
    kcb = KC + b * skc0 + h * skc1 + p * skc2
    if ROTATE:                                  # RoPE of k first, rounded as _rope_kernel (and torch) round
        jh = tl.arange(0, BLOCK_H)
        mh = jh < tl.where(ok, HALF, 0)
        if INTERLEAVED:
            lo, hi = 2 * jh, 2 * jh + 1
        else:
            lo, hi = jh, jh + HALF
        c = tl.load(C + b * sc0 + jh, mask=mh, other=0.0).to(K.dtype.element_ty).to(tl.float32)
        s = tl.load(S + b * sc0 + jh, mask=mh, other=0.0).to(K.dtype.element_ty).to(tl.float32)
        x1 = tl.load(kb + lo, mask=mh, other=0.0).to(tl.float32)
        x2 = tl.load(kb + hi, mask=mh, other=0.0).to(tl.float32)
        re = (c * x1).to(K.dtype.element_ty).to(tl.float32) - (s * x2).to(K.dtype.element_ty).to(tl.float32)
        im = (s * x1).to(K.dtype.element_ty).to(tl.float32) + (c * x2).to(K.dtype.element_ty).to(tl.float32)
        tl.store(kcb + lo, re.to(K.dtype.element_ty).to(KC.dtype.element_ty), mask=mh)
        tl.store(kcb + hi, im.to(K.dtype.element_ty).to(KC.dtype.element_ty), mask=mh)
    else:
        k = tl.load(kb + j, mask=mask)
        tl.store(kcb + j, k.to(KC.dtype.element_ty), mask=mask)
