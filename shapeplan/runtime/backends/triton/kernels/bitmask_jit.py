"""The Triton kernel of ``shapeplan::ApplyTokenBitmask`` (launcher: ``bitmask.py``). This module imports
Triton and nothing else, so a compile worker process can load it by path."""

import triton
import triton.language as tl


@triton.jit
def _apply_bitmask(X, M, Y, V, sx_b, sm_b, sy_b, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = v < V
    words = tl.load(M + row * sm_b + v // 32, mask=ok, other=0)
    keep = ((words >> (v % 32)) & 1) != 0
    x = tl.load(X + row * sx_b + v, mask=ok)
    tl.store(Y + row * sy_b + v, tl.where(keep, x, float("-inf")).to(Y.dtype.element_ty), mask=ok)
