"""The decode GEMV: ``y = x @ W.T`` for one row x (a decode step at batch 1), with the RMSNorm before it
and the residual add or SiLU gate after it done in the same kernel.

    gemv(x, w)                                 x [1, K] @ W.T                 W [N, K], row-major
    gemv(x, w, norm_w=s, eps=e)                rms_norm(x) * s @ W.T          (RMSNorm prologue)
    gemv(x, w, residual=r)                     r + x @ W.T                    (residual epilogue)
    gemv(x, w, glu=True)                       silu(x @ G.T) * (x @ U.T)      W = [G; U] stacked by rows

A decode step at batch 1 is bandwidth-bound: each weight byte is read once, and what costs is every
separate small kernel (norm, add, activation: 1.5-3 µs each in a CUDA graph) and GEMVs that keep too
few loads in flight on a small matrix. One program owns BN output rows of W and walks K in BK-wide
tiles with wide loads, accumulating products elementwise in float32 and summing them once after the
loop. The norm needs no second pass over x: rsqrt(mean(x^2) + eps) is a factor common to the whole
row, so the loop sums x^2 beside the products and the result is scaled once at the end. Rounding:
the product and the gate are rounded to the activation dtype where MatMul and SiluMul round; the
normalized x is not (the unfused RMSNormalization rounds it to bf16 before the product), so the fused
ops differ from the unfused by that rounding and by the order of the K-sum (docs/gpu.md).

Rows: one. Batched decode steps (2+ rows) run the unfused kernels (cuBLAS reads a weight once for all
rows; measured: a tl.dot variant of this kernel lost to it at M = 8, docs/benchmarks).

Programmatic dependent launch (Hopper+, on by default; ``SHAPEPLAN_LLM_GEMV_PDL=0`` turns it off): the
GEMV starts while the kernel before it finishes, loads its first weight tile, then waits for that
kernel (``gdc_wait``) before it reads x; it lets the next kernel launch at once. On the H200 it took
llama-1b from 1,008 to 1,075 tok/s (docs/gpu.md#decode-gemv).

With ``prefetch`` (the attention's output projection) the GEMV's first programs also ask L2 for the whole
weight before that wait, so that it streams while the attention, which leaves memory idle, runs.

Tiles per shape: ``config(n, k)``; ``TUNE`` holds the ones measured on the H200 (probe over BN x BK
x warps, weights rotated through more copies than L2 holds).
"""
from __future__ import annotations

import torch

from shapeplan.runtime.backends.triton.env import interpreting, triton   # before the kernels: Triton's cache under ours
from shapeplan.runtime.backends.triton.kernels.gemv_jit import HAS_GDC, _gemv_kernel

#: (N outputs (after the GLU: rows of W / 2), K) -> (BN, BK, warps), measured on the H200 (2026-12-01)
TUNE: dict[tuple[int, int], tuple[int, int, int]] = {
    (3072, 2048): (8, 1024, 4), (2048, 2048): (2, 1024, 4), (8192, 2048): (2, 1024, 4),     # llama-1b
    (2048, 8192): (1, 1024, 4), (128256, 2048): (8, 1024, 4),
    (6144, 4096): (8, 512, 4), (4096, 4096): (1, 2048, 4), (14336, 4096): (2, 1024, 4),      # llama-8b
    (4096, 14336): (1, 2048, 4), (128256, 4096): (8, 1024, 4),
}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supports(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the kernel applies: one row x [1, K] and W [N, K] with unit stride on K, one float dtype."""
    return (x.dim() == 2 and x.shape[0] == 1 and w.dim() == 2 and w.stride(1) == 1 and w.shape[1] == x.shape[1]
            and x.dtype in _DTYPES and w.dtype == x.dtype and x.device == w.device
            and (x.is_cuda or interpreting()))


_PDL: dict[int, bool] = {}


def pdl(x: torch.Tensor) -> bool:
    """Whether to launch with programmatic dependent launch (``SHAPEPLAN_LLM_GEMV_PDL``, on by default):
    a Hopper-or-later GPU and a Triton with grid dependency control and the
    ``launch_pdl`` option. Each GEMV then loads its first weight tile while the kernel before it ends."""
    return pdl_on(x.device)


def pdl_on(device: torch.device, enabled: bool | None = None) -> bool:
    """``pdl`` for kernels on ``device``; ``enabled``: the switch that turns it on (default:
    ``SHAPEPLAN_LLM_GEMV_PDL``)."""
    from shapeplan import env
    if enabled is None:
        enabled = env.get("SHAPEPLAN_LLM_GEMV_PDL")
    if device.type != "cuda" or not HAS_GDC or not enabled:
        return False
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _PDL:
        try:
            from triton.backends.nvidia.compiler import CUDAOptions
            has_option = "launch_pdl" in CUDAOptions.__dataclass_fields__
        except (ImportError, AttributeError):
            has_option = False
        _PDL[i] = has_option and torch.cuda.get_device_capability(i)[0] >= 9
    return _PDL[i]


#: with ``prefetch``: about this many programs ask L2 for the weight, each a power of two of 128-byte lines
PREFETCH_PROGRAMS = 64


def prefetch_lines(w: torch.Tensor) -> int:
    """PF for a GEMV over ``w`` that prefetches its weight (``gemv(prefetch=True)``): 128-byte lines a program, a
    power of two (at least 128: one a thread), so that about PREFETCH_PROGRAMS programs cover the whole of W; 0
    where it does not apply (``SHAPEPLAN_LLM_GEMV_PREFETCH=0``, or W is not one contiguous block)."""
    from shapeplan import env
    if not env.get("SHAPEPLAN_LLM_GEMV_PREFETCH") or not w.is_contiguous():
        return 0
    lines = triton.cdiv(w.numel() * w.element_size(), 128)
    return max(128, 1 << (triton.cdiv(lines, PREFETCH_PROGRAMS) - 1).bit_length())


def config(n: int, k: int) -> tuple[int, int, int]:
    """(BN, BK, warps) for N outputs and K inputs."""
    hit = TUNE.get((n, k))
    if hit:
        return hit
    return (8 if n >= 65536 else 2), min(1024, 1 << max(4, (k - 1).bit_length())), 4


def gemv(x: torch.Tensor, w: torch.Tensor, *, norm_w: torch.Tensor | None = None, eps: float = 0.0,
         residual: torch.Tensor | None = None, glu: bool = False, out: torch.Tensor | None = None,
         tiles: tuple[int, int, int] | None = None, prefetch: bool = False) -> torch.Tensor:
    """The fused decode GEMV (module doc); x [1, K], w [N, K] -> [1, N] (GLU: [1, N / 2]) in x's dtype.
    ``prefetch`` (with PDL): W is asked of L2 while the kernel before runs (``prefetch_lines``), for a GEMV after
    one that leaves memory idle (the attention's output projection)."""
    k = x.shape[1]
    n = w.shape[0] // 2 if glu else w.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    bn, bk, warps = tiles or config(n, k)
    y = out if out is not None else torch.empty(1, n, dtype=x.dtype, device=x.device)
    r = residual if residual is not None else y
    if r.stride(-1) != 1:
        r = r.contiguous()
    nw = norm_w if norm_w is not None else x
    launch = {"launch_pdl": True} if pdl(x) else {}
    _gemv_kernel[(triton.cdiv(n, bn),)](
        x, nw, w, r, y, n, k, n, w.stride(0), float(eps),
        BN=bn, BK=bk, NORM=norm_w is not None, RES=residual is not None, GLU=glu, EVEN_K=k % bk == 0,
        PDL=bool(launch), PF=prefetch_lines(w) if prefetch and launch and not glu else 0, num_warps=warps,
        **launch)
    return y
