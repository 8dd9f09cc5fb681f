"""Elementwise math: unary (Abs..Atanh, Erf, Sign, Round, IsNaN, IsInf), binary with numpy
broadcasting (Add, Sub, Mul, Div, Pow, Mod), variadic (Max, Min, Mean, Sum) and Clip.

Opset history handled here: opset < 7 binary ops had ``broadcast``/``axis`` attributes (limited
broadcasting of B onto A); opset 1 ops had ``consumed_inputs``; Clip < 11 took min/max as attributes,
>= 11 as optional inputs. uint16/32/64 run in int64 (see _numeric.uint_safe).
Activations (Relu, Sigmoid, Tanh, ...) live in activation.py, Not and comparisons in logic.py.
"""
from __future__ import annotations

import builtins
import functools
from typing import Any

import torch

from shapeplan.ops._numeric import legacy, uint_safe
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import broadcast, same_as

EW = Trait.ELEMENTWISE
EWC = Trait.ELEMENTWISE | Trait.COMMUTATIVE
_F32_MAX = 3.4028234663852886e38

# name -> (torch fn, first opset, had consumed_inputs in opset 1)
_UNARY: dict[str, tuple[Any, int, bool]] = {
    "Abs": (torch.abs, 1, True), "Neg": (torch.neg, 1, True), "Exp": (torch.exp, 1, True),
    "Log": (torch.log, 1, True), "Sqrt": (torch.sqrt, 1, True), "Reciprocal": (torch.reciprocal, 1, True),
    "Floor": (torch.floor, 1, True), "Ceil": (torch.ceil, 1, True),
    "Sin": (torch.sin, 7, False), "Cos": (torch.cos, 7, False), "Tan": (torch.tan, 7, False),
    "Asin": (torch.asin, 7, False), "Acos": (torch.acos, 7, False), "Atan": (torch.atan, 7, False),
    "Sinh": (torch.sinh, 9, False), "Cosh": (torch.cosh, 9, False), "Asinh": (torch.asinh, 9, False),
    "Acosh": (torch.acosh, 9, False), "Atanh": (torch.atanh, 9, False), "Erf": (torch.erf, 9, False),
    "Sign": (torch.sign, 9, False), "Round": (torch.round, 11, False),   # round: half to even
}


def _abs(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.uint8 or x.dtype == torch.bool else torch.abs(x)


def _make_unary(name: str, f: Any, since: int, consumed: bool) -> None:
    f = _abs if name == "Abs" else f

    @uint_safe
    def kernel(x):  # noqa: ANN001
        return f(x)

    kernel.__name__ = name.lower()
    kernel.__doc__ = f"ONNX {name} (elementwise)."
    if consumed:
        register(name, since=1, traits=EW, shape=same_as(0))(legacy(kernel, consumed_inputs=None))
        since = 6
    register(name, since=since, traits=EW, shape=same_as(0))(kernel)


for _n, (_f, _since, _consumed) in _UNARY.items():
    _make_unary(_n, _f, _since, _consumed)


@register("IsNaN", since=9, traits=EW, shape=same_as(0, dtype="bool"))
def isnan(x):
    return torch.isnan(x)


@register("IsInf", since=10, traits=EW, shape=same_as(0, dtype="bool"))
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_positive:
        return torch.isposinf(x)
    if detect_negative:
        return torch.isneginf(x)
    return torch.zeros_like(x, dtype=torch.bool)


# ---------------------------------------------------------------------------------------- binary

def _binary(name: str, traits: Trait, *, legacy_since: tuple[int, ...] = (1,), since: int = 7):
    """Register ``fn`` at ``since`` (numpy broadcasting) and, with the old broadcast/axis/consumed
    attributes, at each of ``legacy_since`` (output shape = A's shape then)."""

    def deco(fn):  # noqa: ANN001
        fn = uint_safe(fn)
        for s in legacy_since:
            register(name, since=s, traits=traits, shape=same_as(0))(
                legacy(fn, broadcast=0, axis=None, consumed_inputs=None))
        register(name, since=since, traits=traits, shape=broadcast())(fn)
        return fn

    return deco


@_binary("Add", EWC)
def add(a, b):
    """ONNX Add: A + B (integers wrap)."""
    return torch.add(a, b)


@_binary("Sub", EW)
def sub(a, b):
    """ONNX Sub: A - B."""
    return torch.sub(a, b)


@_binary("Mul", EWC)
def mul(a, b):
    """ONNX Mul: A * B."""
    if a.dtype == torch.bool:
        return torch.logical_and(a, b)
    return torch.mul(a, b)


@_binary("Div", EW)
def div(a, b):
    """ONNX Div: integer division truncates toward zero (C semantics, like the ONNX reference)."""
    if not a.dtype.is_floating_point and not a.dtype.is_complex:
        return torch.div(a, b, rounding_mode="trunc").to(a.dtype)
    return torch.div(a, b)


@_binary("Pow", EW, since=7)
def pow_(a, b):
    """ONNX Pow: the result has A's dtype; the exponent may be another type."""
    if not a.dtype.is_floating_point and not b.dtype.is_floating_point:
        b = b.to(torch.int64)
        if bool((b < 0).any()):        # torch refuses negative integer powers of integers
            return torch.pow(a.to(torch.float64), b).trunc().to(a.dtype)
        return torch.pow(a.to(torch.int64), b).to(a.dtype)
    return torch.pow(a, b).to(a.dtype)


@register("Mod", since=10, traits=EW, shape=broadcast())
@uint_safe
def mod(a, b, *, fmod=0):
    """ONNX Mod: fmod=0 has the divisor's sign (Python %), fmod=1 the dividend's (C fmod)."""
    if fmod:
        return torch.fmod(a, b)
    return torch.remainder(a, b)


# -------------------------------------------------------------------------------------- variadic

def _variadic(name: str, traits: Trait, *, first: int = 1, since: int = 8):
    def deco(fn):  # noqa: ANN001
        fn = uint_safe(fn)
        register(name, since=first, traits=traits, shape=broadcast())(legacy(fn, consumed_inputs=None))
        register(name, since=6, traits=traits, shape=broadcast())(fn)
        register(name, since=since, traits=traits, shape=broadcast())(fn)
        return fn

    return deco


@_variadic("Max", EWC)
def max_(*xs):
    """ONNX Max over any number of inputs (numpy broadcasting, NaN propagates)."""
    return functools.reduce(torch.maximum, xs)


@_variadic("Min", EWC)
def min_(*xs):
    """ONNX Min over any number of inputs."""
    return functools.reduce(torch.minimum, xs)


@_variadic("Sum", EWC)
def sum_(*xs):
    """ONNX Sum over any number of inputs."""
    return functools.reduce(torch.add, xs)


@_variadic("Mean", EWC)
def mean(*xs):
    """ONNX Mean over any number of inputs."""
    return (functools.reduce(torch.add, xs) / len(xs)).to(xs[0].dtype)


# ------------------------------------------------------------------------------------------ Clip

def _clip_attrs(x, *, min=-_F32_MAX, max=_F32_MAX):  # noqa: A002 - ONNX attribute names
    if x.dtype.is_floating_point:
        return torch.clamp(x, min, max)
    info = torch.iinfo(x.dtype)
    return torch.clamp(x, int(builtins.max(min, info.min)), int(builtins.min(max, info.max)))


register("Clip", since=1, traits=EW, shape=same_as(0))(legacy(_clip_attrs, consumed_inputs=None))
register("Clip", since=6, traits=EW, shape=same_as(0))(_clip_attrs)


@register("Clip", since=11, traits=EW, shape=same_as(0))
@uint_safe
def clip(x, min=None, max=None):  # noqa: A002 - ONNX input names
    """ONNX Clip >= 11: min/max are optional scalar inputs; where min > max every value becomes max."""
    lo = min.reshape(()) if isinstance(min, torch.Tensor) and min.numel() == 1 else min
    hi = max.reshape(()) if isinstance(max, torch.Tensor) and max.numel() == 1 else max
    if lo is None and hi is None:
        return x.clone()
    if lo is not None and hi is not None:
        return torch.minimum(torch.maximum(x, lo.to(x.dtype)), hi.to(x.dtype))
    if lo is not None:
        return torch.maximum(x, lo.to(x.dtype))
    return torch.minimum(x, hi.to(x.dtype))
