"""Launcher of the token-bitmask kernel (the kernel: ``bitmask_jit.py``): grid (B, ceil(V / BLOCK)), each
program reads BLOCK logits of one row and the BLOCK / 32 mask words that cover them, and writes the
logits with forbidden tokens at -inf into a new tensor. Nothing is read on the host, so it captures into
CUDA graphs. Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests)."""
from __future__ import annotations

import torch

from shapeplan.runtime.backends.triton.env import triton   # before the kernel: cache dir, compile workers
from shapeplan.runtime.backends.triton.kernels.bitmask_jit import _apply_bitmask

BLOCK = 4096


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """See ``shapeplan.ops.llm.apply_token_bitmask``: logits [B, V], bitmask int32 [B, ceil(V / 32)]."""
    b, v = logits.shape
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    m = bitmask if bitmask.stride(-1) == 1 and bitmask.dtype == torch.int32 else bitmask.to(torch.int32).contiguous()
    y = torch.empty_like(x)
    _apply_bitmask[(b, triton.cdiv(v, BLOCK))](x, m, y, v, x.stride(0), m.stride(0), y.stride(0), BLOCK=BLOCK)
    return y
