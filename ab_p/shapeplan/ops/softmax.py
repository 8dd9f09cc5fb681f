"""Softmax, LogSoftmax, Hardmax.

Opset < 13: the input is coerced to 2-D at ``axis`` (default 1): [prod(shape[:axis]),
prod(shape[axis:])], the op runs over the second dim, and the result is reshaped back.
Opset >= 13: the op runs along the single dimension ``axis`` (default -1).
"""
from __future__ import annotations

from typing import Callable

import torch

from shapeplan.ops._numeric import norm_axis
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import same_as

_LOW = (torch.float16, torch.bfloat16)


def _softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.softmax(x.float() if x.dtype in _LOW else x, dim).to(x.dtype)


def _log_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.log_softmax(x.float() if x.dtype in _LOW else x, dim).to(x.dtype)


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """1 at the first maximum along ``dim``, 0 elsewhere."""
    if x.numel() == 0:
        return torch.zeros_like(x)
    idx = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter_(dim, idx, 1)


def _coerced(f: Callable[[torch.Tensor, int], torch.Tensor], x: torch.Tensor, axis: int) -> torch.Tensor:
    if x.dim() == 0:
        return f(x.reshape(1, 1), 1).reshape(())
    a = norm_axis(axis, x.dim(), "axis")
    rows = 1
    for d in x.shape[:a]:
        rows *= d
    return f(x.reshape(rows, -1), 1).reshape(x.shape)


def _along(f: Callable[[torch.Tensor, int], torch.Tensor], x: torch.Tensor, axis: int) -> torch.Tensor:
    if x.dim() == 0:
        return f(x.reshape(1), 0).reshape(())
    return f(x, norm_axis(axis, x.dim(), "axis"))


def _register(name: str, f: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    def v1(x, *, axis=1):  # noqa: ANN001
        return _coerced(f, x, axis)

    def v13(x, *, axis=-1):  # noqa: ANN001
        return _along(f, x, axis)

    v1.__name__, v13.__name__ = f"{name.lower()}_v1", name.lower()
    v1.__doc__ = f"ONNX {name} < 13: over the flattened dims from ``axis`` on."
    v13.__doc__ = f"ONNX {name} >= 13: along ``axis``."
    register(name, since=1, traits=Trait.NONE, shape=same_as(0))(v1)
    register(name, since=13, traits=Trait.NONE, shape=same_as(0))(v13)


_register("Softmax", _softmax)
_register("LogSoftmax", _log_softmax)
_register("Hardmax", _hardmax)
