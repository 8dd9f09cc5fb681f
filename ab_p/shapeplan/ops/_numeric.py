"""Numeric helpers shared by the math op families (not an op module: the leading underscore keeps
shapeplan.ops.__init__ from importing it as one).

* torch 2.13 has almost no kernels for uint16/uint32/uint64: :func:`uint_safe` computes those in
  int64 and casts the result back (two's-complement wrap gives the right bits for + - * & | ^).
* ONNX opsets < 7 carried ``broadcast``/``axis``/``consumed_inputs`` attributes; :func:`legacy`
  re-registers a kernel with those attributes accepted.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from shapeplan.errors import ShapeError

WIDE_UINT = frozenset(t for t in (getattr(torch, "uint16", None), getattr(torch, "uint32", None),
                                  getattr(torch, "uint64", None)) if t is not None)


def is_wide_uint(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in WIDE_UINT


def widen(x: Any) -> Any:
    """uint16/32/64 -> int64 (uint64 values >= 2**63 wrap, bit-exact); anything else unchanged."""
    return x.to(torch.int64) if is_wide_uint(x) else x


def narrow(y: Any, dtype: torch.dtype) -> Any:
    """int64 result -> the original unsigned dtype (wrapping modulo 2**bits)."""
    if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or dtype == torch.int64:
        return y
    if dtype in WIDE_UINT and dtype != torch.uint64:
        bits = torch.iinfo(dtype).bits
        y = y & ((1 << bits) - 1)
    return y.to(dtype)


def uint_safe(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` in int64 when any input is uint16/32/64; int64 outputs go back to that dtype."""

    @functools.wraps(fn)
    def wrapper(*xs: Any, **kw: Any) -> Any:
        wide = next((x.dtype for x in xs if is_wide_uint(x)), None)
        if wide is None:
            return fn(*xs, **kw)
        out = fn(*(widen(x) for x in xs), **kw)
        if isinstance(out, tuple):
            return tuple(narrow(o, wide) for o in out)
        return narrow(out, wide)

    return wrapper


def legacy(fn: Callable[..., Any], **extra: Any) -> Callable[..., Any]:
    """A kernel that also accepts the pre-opset-7 attributes ``extra`` (name=default).

    ``broadcast``/``axis`` are applied to the second input (ONNX's old "limited broadcasting");
    ``consumed_inputs`` and ``is_test`` are ignored (they were hints for in-place execution).
    """
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    var_kw = [p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    added = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in extra.items()
             if k not in sig.parameters]

    def wrapper(*xs: Any, **kw: Any) -> Any:
        broadcast = kw.pop("broadcast", 0)
        axis = kw.pop("axis", None) if "axis" in extra else None
        for k in ("consumed_inputs", "is_test"):
            kw.pop(k, None)
        if "broadcast" in extra and len(xs) >= 2 and xs[1] is not None:
            xs = (xs[0], legacy_broadcast(xs[0], xs[1], broadcast, axis), *xs[2:])
        return fn(*xs, **kw)

    wrapper.__signature__ = sig.replace(parameters=params + added + var_kw)  # type: ignore[attr-defined]
    wrapper.__name__ = f"{fn.__name__}_legacy"
    wrapper.__doc__ = fn.__doc__
    return wrapper


def legacy_broadcast(a: Any, b: Any, broadcast: int, axis: int | None) -> Any:
    """Opset < 7 broadcasting: with ``broadcast=1``, B's shape matches A's starting at ``axis``
    (default: suffix-aligned, which is numpy's rule)."""
    if not broadcast:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape \
                and b.numel() != 1:
            raise ShapeError(f"opset<7 elementwise op without broadcast=1 needs equal shapes, "
                             f"got {list(a.shape)} and {list(b.shape)}")
        return b
    if axis is None or b.dim() == 0:
        return b
    axis = axis + a.dim() if axis < 0 else axis
    trailing = a.dim() - axis - b.dim()
    return b.reshape(tuple(b.shape) + (1,) * trailing) if trailing > 0 else b


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise ShapeError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return a
