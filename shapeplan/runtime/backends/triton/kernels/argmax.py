"""ArgMax / ArgMin over the last axis of long rows (an LLM's vocabulary) in two small Triton kernels.

``argmax(x, largest)``: x [R, N] (last dim contiguous) -> int64 [R]; the same answer as
``torch.argmax``/``argmin``: the first index of the extreme, the first NaN when the row has one.
Pass 1, grid (R, NSPLIT): each program takes PER entries of its row (BLOCK at a time) and writes its
extreme, the first index of it, and its first NaN; pass 2, grid (R,): merges a row's splits. Torch's
two-stage path (``ops/reduce.arg_two_stage``) runs five kernels for the same answer. With programmatic
dependent launch (``kernels/gemv.pdl``: the LM head GEMV before it lets it launch early) each pass
waits for the kernel before it (``gdc_wait``) and starts without a launch gap.
Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""
from __future__ import annotations

import torch

from shapeplan.runtime.backends.triton.env import triton   # before the kernels: Triton's cache under ours
from shapeplan.runtime.backends.triton.kernels.argmax_jit import _arg_merge, _arg_partial

#: entries per pass-1 program (a multiple of BLOCK) and per loop step
PER, BLOCK = 4096, 2048


def argmax(x: torch.Tensor, largest: bool = True) -> torch.Tensor:
    """x [R, N] -> int64 [R] (see the module doc)."""
    from shapeplan.runtime.backends.triton.kernels import gemv
    r, n = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    nsplit = triton.cdiv(n, PER)
    dev = x.device
    val = torch.empty(r * nsplit, dtype=torch.float32, device=dev)
    idx = torch.empty(r * nsplit, dtype=torch.int64, device=dev)
    nan = torch.empty_like(idx)
    out = torch.empty(r, dtype=torch.int64, device=dev)
    launch = {"launch_pdl": True} if gemv.pdl(x) else {}
    _arg_partial[(r, nsplit)](x, val, idx, nan, n, x.stride(0), PER, nsplit, BLOCK=BLOCK, LARGEST=largest,
                              PDL=bool(launch), num_warps=8, **launch)
    _arg_merge[(r,)](val, idx, nan, out, nsplit, NSP=max(2, 1 << (nsplit - 1).bit_length()), PDL=bool(launch),
                     num_warps=1, **launch)
    return out


def precompile(rows: int, n: int, dtype: torch.dtype, largest: bool = True) -> None:
    """Compile both passes for [rows, n] rows of ``dtype`` without touching the device (Triton's
    ``warmup``): the LLM pipeline's start-up compiles the greedy pick over the vocabulary in the
    background."""
    from shapeplan.runtime.backends.triton.env import interpreting
    from shapeplan.runtime.backends.triton.kernels import gemv
    if interpreting():
        return
    nsplit = triton.cdiv(n, PER)
    launch = {"launch_pdl": True} if gemv.pdl_on(torch.device("cuda")) else {}
    f32, i64 = torch.float32, torch.int64
    _arg_partial.warmup(dtype, f32, i64, i64, n, n, PER, nsplit, BLOCK=BLOCK, LARGEST=largest, PDL=bool(launch),
                        num_warps=8, grid=(rows, nsplit), **launch)
    _arg_merge.warmup(f32, i64, i64, i64, nsplit, NSP=max(2, 1 << (nsplit - 1).bit_length()), PDL=bool(launch),
                      num_warps=1, grid=(rows,), **launch)
