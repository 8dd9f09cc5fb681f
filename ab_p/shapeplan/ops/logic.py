"""Comparisons (Equal, Greater, GreaterOrEqual, Less, LessOrEqual), logical (And, Or, Xor, Not),
bitwise (BitwiseAnd/Or/Xor/Not) and BitShift. Comparisons and logical ops output bool.

Equal also accepts ONNX string tensors (numpy object arrays, opset 19). uint16/32/64 run in int64.
"""
from __future__ import annotations

import numpy as np
import torch

from shapeplan.ops._numeric import WIDE_UINT, legacy, uint_safe, widen
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import broadcast, same_as

EW = Trait.ELEMENTWISE
EWC = Trait.ELEMENTWISE | Trait.COMMUTATIVE
_LEGACY = {"broadcast": 0, "axis": None}


def _cmp(name: str, traits: Trait, since: int = 7, *, legacy_since: int | None = 1):
    def deco(fn):  # noqa: ANN001
        if legacy_since is not None:
            register(name, since=legacy_since, traits=traits, shape=same_as(0, dtype="bool"))(
                legacy(fn, **_LEGACY))
        register(name, since=since, traits=traits, shape=broadcast(dtype="bool"))(fn)
        return fn

    return deco


def _strings(a, b) -> torch.Tensor | None:  # noqa: ANN001
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return torch.from_numpy(np.asarray(np.asarray(a).astype(str) == np.asarray(b).astype(str)))
    return None


@_cmp("Equal", EWC)
def equal(a, b):
    s = _strings(a, b)
    return s if s is not None else torch.eq(widen(a), widen(b))


@_cmp("Greater", EW)
def greater(a, b):
    return torch.gt(widen(a), widen(b))


@_cmp("Less", EW)
def less(a, b):
    return torch.lt(widen(a), widen(b))


@_cmp("GreaterOrEqual", EW, since=12, legacy_since=None)
def greater_equal(a, b):
    return torch.ge(widen(a), widen(b))


@_cmp("LessOrEqual", EW, since=12, legacy_since=None)
def less_equal(a, b):
    return torch.le(widen(a), widen(b))


@_cmp("And", EWC)
def and_(a, b):
    return torch.logical_and(a, b)


@_cmp("Or", EWC)
def or_(a, b):
    return torch.logical_or(a, b)


@_cmp("Xor", EWC)
def xor(a, b):
    return torch.logical_xor(a, b)


@register("Not", since=1, traits=EW, shape=same_as(0))
def not_(x):
    return torch.logical_not(x)


# ---------------------------------------------------------------------------------------- bitwise

@register("BitwiseAnd", since=18, traits=EWC, shape=broadcast())
@uint_safe
def bitwise_and(a, b):
    return torch.bitwise_and(a, b)


@register("BitwiseOr", since=18, traits=EWC, shape=broadcast())
@uint_safe
def bitwise_or(a, b):
    return torch.bitwise_or(a, b)


@register("BitwiseXor", since=18, traits=EWC, shape=broadcast())
@uint_safe
def bitwise_xor(a, b):
    return torch.bitwise_xor(a, b)


@register("BitwiseNot", since=18, traits=EW, shape=same_as(0))
@uint_safe
def bitwise_not(x):
    return torch.bitwise_not(x)


@register("BitShift", since=11, traits=EW, shape=broadcast())
def bit_shift(x, y, *, direction):
    """Logical shifts for unsigned types, arithmetic right shift for signed ones (opset 28). A shift
    by a negative amount or by >= the bit width gives the sign fill: 0, or -1 for a negative X
    shifted right."""
    dtype = x.dtype
    bits = torch.iinfo(dtype).bits
    signed = dtype.is_signed
    unsigned64 = dtype == getattr(torch, "uint64", None)
    xi, yi = widen(x).to(torch.int64) if dtype in WIDE_UINT or dtype == torch.uint8 else x, widen(y)
    yi = yi.to(torch.int64)
    out_of_range = (yi < 0) | (yi >= bits)
    s = yi.clamp(0, bits - 1)
    if direction == "LEFT":
        res = torch.bitwise_left_shift(xi, s.to(xi.dtype))
    elif direction == "RIGHT":
        if unsigned64:          # xi holds the uint64 bits; make the int64 shift logical
            shifted = torch.bitwise_right_shift(torch.bitwise_right_shift(xi, 1) & 0x7FFFFFFFFFFFFFFF,
                                                (s - 1).clamp(min=0))
            res = torch.where(s == 0, xi, shifted)
        else:
            res = torch.bitwise_right_shift(xi, s.to(xi.dtype))
    else:
        raise ValueError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    fill = torch.zeros((), dtype=xi.dtype, device=x.device)
    if signed and direction == "RIGHT":
        fill = torch.where(xi < 0, torch.full_like(xi, -1), torch.zeros_like(xi))
    res = torch.where(out_of_range, fill, res)
    if res.dtype != dtype:
        if not signed and bits < 64:
            res = res & ((1 << bits) - 1)
        res = res.to(dtype)
    return res
