"""The Triton kernels of ``argmax`` (its launcher is there): arg-extreme of long rows in two passes.

This module imports Triton and nothing else (no torch, no shapeplan), so a compile worker process can
load it by path.
"""

import triton
import triton.language as tl

try:                                       # grid dependency control (Hopper+): Triton 3.3 and later
    from triton.language.extra.cuda import gdc_wait
    HAS_GDC = True
except ImportError:
    gdc_wait = None
    HAS_GDC = False

BIG = tl.constexpr(2 ** 62)                # "no index" (larger than any row length)


@triton.jit
def _arg_partial(X, VAL, IDX, NAN, N, stride_x, PER, NSPLIT, BLOCK: tl.constexpr, LARGEST: tl.constexpr,
                 PDL: tl.constexpr):
    """Program (row, split) over entries [split * PER, (split + 1) * PER) of its row: the extreme (for
    argmin the negated minimum), the first index holding it, and the first NaN's index (BIG: none)."""
    row = tl.program_id(0)
    sp = tl.program_id(1)
    if PDL:                                # the logits come from the kernel before: wait for it first
        gdc_wait()
    start = sp * PER
    stop = tl.minimum(start + PER, N)
    offs = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_i = tl.full([], BIG, tl.int64)
    nan_i = tl.full([], BIG, tl.int64)
    for c in range(start, stop, BLOCK):
        i = c + offs
        ok = i < stop
        v = tl.load(X + row.to(tl.int64) * stride_x + i, mask=ok, other=0.0).to(tl.float32)
        if not LARGEST:
            v = -v
        nan = (v != v) & ok
        nan_i = tl.minimum(nan_i, tl.min(tl.where(nan, i.to(tl.int64), BIG), axis=0))
        vv = tl.where(ok & ~nan, v, float("-inf"))
        m = tl.max(vv, axis=0)
        first = tl.min(tl.where((vv == m) & ok & ~nan, i.to(tl.int64), BIG), axis=0)
        take = (m > best) | ((m == best) & (first < best_i))
        best_i = tl.where(take, first, best_i)
        best = tl.maximum(best, m)
    k = row * NSPLIT + sp
    tl.store(VAL + k, best)
    tl.store(IDX + k, best_i)
    tl.store(NAN + k, nan_i)


@triton.jit
def _arg_merge(VAL, IDX, NAN, OUT, NSPLIT, NSP: tl.constexpr, PDL: tl.constexpr):
    """One program per row: the first NaN if the row has one, else the first index of the extreme."""
    row = tl.program_id(0)
    if PDL:
        gdc_wait()
    s = tl.arange(0, NSP)
    ok = s < NSPLIT
    k = row * NSPLIT + s
    val = tl.load(VAL + k, mask=ok, other=float("-inf"))
    idx = tl.load(IDX + k, mask=ok, other=BIG)
    nan = tl.min(tl.load(NAN + k, mask=ok, other=BIG), axis=0)
    m = tl.max(val, axis=0)
    first = tl.min(tl.where((val == m) & ok, idx, BIG), axis=0)
    first = tl.where(first == BIG, 0, first)       # a row of -inf (or +inf for argmin) only: index 0
    tl.store(OUT + row, tl.where(nan < BIG, nan, first))
