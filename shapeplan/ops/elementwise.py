"""Elementwise ops (unary, binary with numpy broadcasting, variadic)."""
from __future__ import annotations

import torch

from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import broadcast, same_as

EW = Trait.ELEMENTWISE
EWC = Trait.ELEMENTWISE | Trait.COMMUTATIVE

_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal, "Floor": torch.floor, "Ceil": torch.ceil, "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid, "Relu": torch.relu, "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan,
    "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh,
    "Asinh": torch.asinh, "Acosh": torch.acosh, "Atanh": torch.atanh, "Erf": torch.erf,
    "Sign": torch.sign, "Not": torch.logical_not, "Round": torch.round,
}


def _make_unary(name: str, f):  # noqa: ANN001
    @register(name, traits=EW, shape=same_as(0))
    def kernel(x):  # noqa: ANN001
        return f(x)
    kernel.__name__ = name.lower()
    kernel.__doc__ = f"ONNX {name}."
    return kernel


for _n, _f in _UNARY.items():
    _make_unary(_n, _f)


@register("Add", traits=EWC, shape=broadcast())
def add(a, b):
    return a + b


@register("Sub", traits=EW, shape=broadcast())
def sub(a, b):
    return a - b


@register("Mul", traits=EWC, shape=broadcast())
def mul(a, b):
    return a * b


@register("Div", traits=EW, shape=broadcast())
def div(a, b):
    if not a.dtype.is_floating_point and not a.dtype.is_complex:
        return torch.div(a, b, rounding_mode="trunc").to(a.dtype)
    return a / b


@register("Pow", traits=EW, shape=broadcast())
def pow_(a, b):
    out = torch.pow(a, b.to(a.dtype) if a.dtype.is_floating_point else b)
    return out.to(a.dtype)
