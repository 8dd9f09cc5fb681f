"""Activation functions (elementwise, output shape and dtype = input's).

Every kernel follows the formula of the ONNX spec literally (no "close enough" torch substitutes
whose edge cases differ); attribute defaults are those of the spec.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from shapeplan.ops._numeric import legacy
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import same_as

EW = Trait.ELEMENTWISE


def _act(name: str, since: int, *, v1_attrs: dict | None = None):
    """Register an activation; with ``v1_attrs`` also an opset-1 version accepting them."""

    def deco(fn):  # noqa: ANN001
        if v1_attrs is not None:
            register(name, since=1, traits=EW, shape=same_as(0))(legacy(fn, **v1_attrs))
        register(name, since=since, traits=EW, shape=same_as(0))(fn)
        return fn

    return deco


_CONSUMED = {"consumed_inputs": None}


@_act("Relu", 6, v1_attrs=_CONSUMED)
def relu(x):
    """max(0, x); integer types allowed since opset 14."""
    if x.dtype == torch.bool or x.dtype == torch.uint8:
        return x.clone()
    return torch.relu(x)


@_act("Sigmoid", 6, v1_attrs=_CONSUMED)
def sigmoid(x):
    return torch.sigmoid(x)


@_act("Tanh", 6, v1_attrs=_CONSUMED)
def tanh(x):
    return torch.tanh(x)


@_act("LeakyRelu", 6, v1_attrs=_CONSUMED)
def leaky_relu(x, *, alpha=0.01):
    return torch.where(x >= 0, x, x * alpha)


@register("PRelu", since=1, traits=EW, shape=same_as(0))
def _prelu_v1(x, slope, *, consumed_inputs=None):
    return prelu(x, slope)


@register("PRelu", since=7, traits=EW, shape=same_as(0))
def prelu(x, slope):
    """x if x >= 0 else slope * x; slope broadcasts onto x (unidirectionally)."""
    if slope.dim() == 1 and x.dim() > 2 and slope.shape[0] == x.shape[1] and slope.shape[0] != x.shape[-1]:
        slope = slope.reshape((-1,) + (1,) * (x.dim() - 2))    # per-channel slope of old exporters
    return torch.where(x < 0, x * slope, x).to(x.dtype)


@_act("Elu", 6, v1_attrs=_CONSUMED)
def elu(x, *, alpha=1.0):
    return torch.where(x > 0, x, alpha * torch.expm1(x)).to(x.dtype)


@_act("Selu", 6, v1_attrs=_CONSUMED)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return (gamma * torch.where(x > 0, x, alpha * torch.expm1(x))).to(x.dtype)


@_act("Celu", 12)
def celu(x, *, alpha=1.0):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return (torch.clamp(x, min=0) + torch.clamp(alpha * torch.expm1(x / alpha), max=0)).to(x.dtype)


@_act("ThresholdedRelu", 10)
def thresholded_relu(x, *, alpha=1.0):
    return torch.where(x > alpha, x, torch.zeros_like(x))


@_act("HardSigmoid", 6, v1_attrs=_CONSUMED)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return torch.clamp(alpha * x + beta, 0, 1).to(x.dtype)


@_act("HardSwish", 14)
def hard_swish(x):
    """x * max(0, min(1, x / 6 + 0.5))."""
    return (x * torch.clamp(x * (1.0 / 6.0) + 0.5, 0, 1)).to(x.dtype)


@_act("Softplus", 1)
def softplus(x):
    """log(exp(x) + 1), computed stably (x + log1p(exp(-x)) for large x)."""
    return (torch.clamp(x, min=0) + torch.log1p(torch.exp(-torch.abs(x)))).to(x.dtype)


@_act("Softsign", 1)
def softsign(x):
    return x / (1 + torch.abs(x))


@_act("Mish", 18)
def mish(x):
    """x * tanh(softplus(x))."""
    return (x * torch.tanh(softplus(x))).to(x.dtype)


@_act("Swish", 24)
def swish(x, *, alpha=1.0):
    """x * sigmoid(alpha * x)."""
    return (x * torch.sigmoid(alpha * x)).to(x.dtype)


@_act("Gelu", 20)
def gelu(x, *, approximate="none"):
    """0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation with approximate="tanh"."""
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return F.gelu(x, approximate=approximate)


@_act("Shrink", 9)
def shrink(x, *, bias=0.0, lambd=0.5):
    """x + bias if x < -lambd; x - bias if x > lambd; else 0 (integer types too)."""
    zero = torch.zeros_like(x)
    if x.dtype.is_floating_point:
        return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero))
    xi = x.to(torch.float64)
    out = torch.where(xi < -lambd, xi + bias, torch.where(xi > lambd, xi - bias, zero.to(torch.float64)))
    return out.to(x.dtype)
