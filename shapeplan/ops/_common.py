"""Argument helpers shared by the op families (not an op module: the leading underscore keeps
shapeplan.ops.__init__ from importing it as one).

* Shape functions read an input's compile-time value with :func:`const_of` and :func:`ints`;
* kernels normalise axes with :func:`norm_axis` (an out-of-range axis is an ExecutionError);
* :func:`strings_ok` lets a pure data-movement kernel run on ONNX string tensors;
* :func:`triton_kernels` imports a hand-written Triton kernel module once, or records why it cannot.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from shapeplan.errors import ExecutionError
from shapeplan.ir.graph import ValueKind


def const_of(v: Any) -> Any:
    """The compile-time value of Value ``v`` (an initializer or a Constant node's output), else None."""
    if v is None:
        return None
    if v.kind is ValueKind.CONSTANT and v.data is not None:
        return v.data
    p = v.producer
    if p is not None and p.op_type == "Constant" and not p.domain:
        for key in ("value", "value_int", "value_ints", "value_float", "value_floats"):
            if key in p.attrs:
                val = p.attrs[key]
                return val if isinstance(val, torch.Tensor) else torch.tensor(val)
    return None


def ints(t: Any) -> list[int]:
    """An int64 tensor / list / scalar -> list of Python ints (one host read)."""
    if isinstance(t, torch.Tensor):
        return [int(i) for i in t.reshape(-1).tolist()]
    if isinstance(t, (list, tuple)):
        return [int(i) for i in t]
    return [int(t)]


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ExecutionError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def dim_prod(dims: Any) -> Any:
    """Product of dims; None when any dim is not a concrete int."""
    out = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        out *= d
    return out


def strings_ok(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Let a pure data-movement kernel run on ONNX string tensors (numpy object arrays): the strings
    become int64 codes into one table, the kernel moves the codes, and the outputs are decoded."""

    @functools.wraps(fn)
    def kernel(*args: Any, **kw: Any) -> Any:
        if not any(isinstance(a, np.ndarray) and a.dtype == object for a in args):
            return fn(*args, **kw)
        table: list[Any] = []
        coded = []
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype == object:
                coded.append(torch.arange(len(table), len(table) + a.size, dtype=torch.int64).reshape(a.shape))
                table.extend(a.reshape(-1).tolist())
            else:
                coded.append(a)
        lut = np.empty(len(table), dtype=object)
        lut[:] = table

        def decode(t: torch.Tensor) -> np.ndarray:
            return lut[t.reshape(-1).cpu().numpy()].reshape(tuple(t.shape))

        out = fn(*coded, **kw)
        return tuple(decode(o) for o in out) if isinstance(out, tuple) else decode(out)

    return kernel


def input_at(node: Any, i: int) -> Any:
    """The node's ``i``-th input, None when it is absent (optional trailing inputs)."""
    return node.inputs[i] if i < len(node.inputs) else None


class KernelChoice:
    """Whether a family of ops runs its Triton kernels: ``mode`` auto (on CUDA tensors), triton (wherever
    Triton runs: CPU tensors under ``TRITON_INTERPRET=1``, tests) or torch (never); after a kernel has
    failed (``fallback``: one FALLBACK event naming the op and the reason) the family keeps to its torch
    kernels for the rest of the process. ``failed`` holds the reasons."""

    def __init__(self, what: str, instead: str) -> None:
        self.what, self.instead = what, instead     # e.g. "the fused Triton GEMV", "running the unfused kernels"
        self.mode = "auto"
        self.failed: list[str] = []

    def set(self, mode: str) -> str:
        """Choose the mode (auto | triton | torch); returns the previous one."""
        if mode not in ("auto", "triton", "torch"):
            raise ValueError(f"{self.what}: the mode must be auto, triton or torch, got {mode!r}")
        old, self.mode = self.mode, mode
        return old

    def applies(self, t: torch.Tensor) -> bool:
        """Whether the Triton kernels are to run on ``t`` (mode, device, no failure yet)."""
        return self.mode != "torch" and not self.failed and (self.mode == "triton" or t.is_cuda)

    def fallback(self, e: Exception, op: str) -> None:
        self.failed.append(f"{type(e).__name__}: {e}")
        from shapeplan import diagnostics
        diagnostics.record("FALLBACK", f"{op}: {self.what} failed, {self.instead}", reason=self.failed[-1][:300])


def triton_kernels(state: list, module: str, what: str) -> Any:
    """The launcher module ``shapeplan.runtime.backends.triton.kernels.<module>``, imported on first use and
    kept in ``state`` (a module-level list: a test may put ``[None]`` there to force the torch kernels),
    or None when Triton cannot run here: then a FALLBACK event names ``what`` and the reason, once."""
    if not state:
        try:
            import importlib
            state.append(importlib.import_module(f"shapeplan.runtime.backends.triton.kernels.{module}"))
        except Exception as e:  # noqa: BLE001 - no triton / unsupported GPU
            state.append(None)
            from shapeplan import diagnostics
            diagnostics.record("FALLBACK", f"{what}: Triton kernels unavailable, using torch",
                               reason=f"{type(e).__name__}: {e}"[:300])
    return state[0]
