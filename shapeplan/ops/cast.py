"""Cast, CastLike, BitCast.

Runtime representation of the types torch lacks (see ir/tensors.py): int4/int2 live in int8 tensors,
uint4/uint2 in uint8 tensors, float4e2m1 in float32 tensors, each holding the exact value; strings are
numpy object arrays. Every conversion to a sub-byte or float8 type is our own arithmetic, written from
the ONNX spec (the Cast operator's tables and docs/technical/int4.md), never a library's cast: the
resolver's ``ml_dtypes`` changed its float -> int4 cast between releases (0.5 wrapped, 0.7 gives 0 out of
range), and neither is what the spec says.

* float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ): round to nearest even; with ``saturate=1`` (default) a
  value that rounds beyond the largest finite value (inf too) becomes +-FLT_MAX; with ``saturate=0``
  it becomes NaN (+-inf for E5M2). The rounding inside the range is torch's float8 conversion (IEEE
  round to nearest even); the range and the special values are decided here, per the spec's table.
* float -> int4/uint4/int2/uint2: round to the nearest integer, ties to even (int4.md), then saturate
  to the type's range (the spec leaves an out-of-range float -> integer cast undefined; saturating is
  what QuantizeLinear does for these types, and what a quantizer expects); NaN -> 0.
* integer -> int4/uint4/int2/uint2: keep the low bits and reinterpret (the spec's fixed-point rule:
  200 (int16) -> -56 (int8)); bool -> 0 / 1.
* float4e2m1: round to nearest even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; NaN -> -0.
* float8e8m0: from the float32 exponent, rounded per ``round_mode`` (up | down | nearest).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shapeplan.errors import ModelError
from shapeplan.ir.dtypes import DType, dtype as as_dtype
from shapeplan.ops.registry import Trait, register

EW = Trait.ELEMENTWISE
_SUB_BYTE_INT = {"int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}
_FP4_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP4_EVEN = (True, False, True, False, True, False, True, False)    # mantissa bit 0


def target_dtype(to: Any) -> DType:
    """``to`` as an ONNX code (opset >= 6) or a type name such as "FLOAT" (opset 1)."""
    if isinstance(to, str):
        import onnx                            # only for opset-1 type names: onnx pulls in ml_dtypes (~1 s)
        try:
            to = onnx.TensorProto.DataType.Value(to.upper())
        except ValueError as e:
            raise ModelError(f"Cast: unknown target type {to!r}") from e
    try:
        return as_dtype(int(to))
    except ValueError as e:
        raise ModelError(f"Cast: target type code {to} is not supported") from e


def _cast_shape(node: Any) -> list:
    x = node.inputs[0]
    to = node.attrs.get("to")
    return [(target_dtype(to) if to is not None else None, x.shape)]


def _castlike_shape(node: Any) -> list:
    return [(node.inputs[1].dtype, node.inputs[0].shape)]


# --------------------------------------------------------------------------------- conversions

def _from_strings(x: np.ndarray, dst: DType, device: Any = "cpu") -> Any:
    if dst.name == "string":
        return x.copy()
    flat = [str(s) for s in x.reshape(-1)]
    if dst.is_float or dst.name in ("float4e2m1",) or dst.torch is None:
        vals = torch.tensor([float(s) for s in flat], dtype=torch.float64).reshape(x.shape)
        return cast_tensor(vals, dst, saturate=1)
    if dst.name == "bool":
        return torch.tensor([float(s) != 0 for s in flat], dtype=torch.bool).reshape(x.shape)

    def as_int(s: str) -> int:
        try:
            return int(s)
        except ValueError:
            return int(float(s))

    vals = torch.tensor([as_int(s) for s in flat], dtype=torch.int64).reshape(x.shape)
    return cast_tensor(vals, dst, saturate=1)


def _to_strings(x: torch.Tensor, src: DType) -> np.ndarray:
    from shapeplan.ir.tensors import runtime_to_numpy
    arr = runtime_to_numpy(x)
    if src.name in ("bfloat16",) or src.name.startswith("float8"):
        arr = arr.astype(np.float32)
    return arr.astype(np.str_).astype(object)


#: float8 type -> (the smallest magnitude that rounds past the largest finite value, what saturate=0
#: gives there). Ties go to the even neighbour: E4M3FN's max 448 (mantissa 110) keeps the tie at 464;
#: the others' maxima have an odd last mantissa bit, so their tie rounds up and out of range.
_F8_OVERFLOW = {"float8e4m3fn": (464.0, False, "nan"), "float8e4m3fnuz": (248.0, True, "nan"),
                "float8e5m2": (61440.0, True, "inf"), "float8e5m2fnuz": (61440.0, True, "nan")}


def _float8(x: torch.Tensor, dst: DType, saturate: int) -> torch.Tensor:
    assert dst.torch is not None
    xf = x.to(torch.float32) if x.dtype != torch.float64 else x
    big = torch.finfo(dst.torch).max
    inside = torch.clamp(xf, -big, big).to(dst.torch)      # NaN stays NaN; +-inf -> +-FLT_MAX
    if saturate:
        return inside
    edge, tie_overflows, special = _F8_OVERFLOW[dst.name]
    a = torch.abs(xf)
    over = (a >= edge) if tie_overflows else (a > edge)
    if special == "inf":
        out = torch.where(torch.signbit(xf), torch.full_like(xf, float("-inf")), torch.full_like(xf, float("inf")))
    else:
        out = torch.full_like(xf, float("nan"))
    return torch.where(over, out.to(dst.torch), inside)


def _sub_byte_int(x: torch.Tensor, bits: int, signed: bool) -> torch.Tensor:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if x.dtype.is_floating_point:
        xf = torch.nan_to_num(x.to(torch.float64), nan=0.0)
        v = torch.clamp(torch.round(xf), lo, hi).to(torch.int64)       # torch.round: ties to even
    else:                                                            # fixed point: keep the low bits
        v = x.to(torch.int64) & ((1 << bits) - 1)
        if signed:
            v = torch.where(v > hi, v - (1 << bits), v)
    return v.to(torch.int8 if signed else torch.uint8)


def _float4(x: torch.Tensor) -> torch.Tensor:
    xf = x.to(torch.float32)
    a = torch.abs(xf)
    idx = torch.zeros(a.shape, dtype=torch.int64, device=a.device)
    for i in range(len(_FP4_GRID) - 1):
        mid = (_FP4_GRID[i] + _FP4_GRID[i + 1]) / 2
        up = (a > mid) | ((a == mid) & _FP4_EVEN[i + 1])
        idx = idx + up.to(torch.int64)
    grid = torch.tensor(_FP4_GRID, dtype=torch.float32, device=a.device)
    out = grid[idx]
    neg = torch.signbit(xf)
    out = torch.where(neg, -out, out)
    # float4e2m1 has no NaN; ml_dtypes maps NaN to -0
    return torch.where(torch.isnan(xf), torch.full_like(out, -0.0), out)


def _float8e8m0(x: torch.Tensor, saturate: int, round_mode: str) -> torch.Tensor:
    f = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent = (f >> 23) & 0xFF
    special = exponent == 0xFF
    normal = ~special
    if round_mode == "nearest":
        g = (f & 0x400000) > 0
        r = (f & 0x200000) > 0
        s = (f & 0x1FFFFF) > 0
        lsb = exponent > 0
        round_up = g & (r | s | lsb) & normal
    elif round_mode == "up":
        round_up = ((f & 0x7FFFFF) > 0) & normal
    elif round_mode == "down":
        round_up = torch.zeros_like(special)
    else:
        raise ModelError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    if saturate:
        round_up = round_up & ~(exponent == 0xFE)
    exponent = torch.where(special, torch.full_like(exponent, 0xFF), exponent + round_up.to(torch.int64))
    return (exponent & 0xFF).to(torch.uint8).view(torch.float8_e8m0fnu)


def cast_tensor(x: torch.Tensor, dst: DType, saturate: int = 1, round_mode: str = "up") -> Any:
    """Convert a runtime tensor to ``dst`` with ONNX Cast semantics."""
    name = dst.name
    if name in _SUB_BYTE_INT:
        return _sub_byte_int(x, *_SUB_BYTE_INT[name])
    if name == "float4e2m1":
        return _float4(x)
    if name == "float8e8m0":
        return _float8e8m0(x, saturate, round_mode)
    if dst.torch is None:
        raise ModelError(f"Cast: casting to {name} is not supported")
    if name.startswith("float8"):
        return _float8(x, dst, saturate)
    if x.dtype == torch.bool or dst.torch == torch.bool:
        return x.to(dst.torch)
    if x.dtype.is_floating_point and not dst.torch.is_floating_point:
        if x.dtype.itemsize == 1 or x.dtype == torch.bfloat16:
            x = x.to(torch.float32)
        if dst.torch in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):   # go through int64:
            return x.to(torch.int64).to(dst.torch)                                # wrap like C/numpy
    return x.to(dst.torch)


def cast_value(x: Any, dst: DType, saturate: int = 1, round_mode: str = "up") -> Any:
    if isinstance(x, np.ndarray):
        return _from_strings(x, dst)
    if dst.name == "string":
        return _to_strings(x, as_dtype(x.dtype))
    return cast_tensor(x, dst, saturate, round_mode)


# ------------------------------------------------------------------------------------------- ops

@register("Cast", since=1, traits=EW, shape=_cast_shape)
def cast(x, *, to, saturate=1, round_mode="up"):
    """ONNX Cast (all opsets: ``to`` was a type name in opset 1; saturate from 19; round_mode 24)."""
    return cast_value(x, target_dtype(to), saturate, round_mode)


def _like_dtype(like: Any) -> DType:
    return as_dtype("string") if isinstance(like, np.ndarray) else as_dtype(like.dtype)


def cast_like(x, like, *, saturate=1, round_mode="up"):
    """ONNX CastLike: Cast to the element type of ``like``.

    int4/float4 targets are stored widened at run time, so the kernel cannot tell them from the
    tensor; the bound version below asks the node's declared type first."""
    return cast_value(x, _like_dtype(like), saturate, round_mode)


def _bind_castlike(node: Any, opset: int) -> Any:
    declared = node.inputs[1].dtype if node.inputs[1] is not None else None
    attrs = {k: v for k, v in node.attrs.items() if k in ("saturate", "round_mode")}

    def call(x: Any, like: Any) -> tuple:
        dst = declared if declared is not None else _like_dtype(like)
        return (cast_value(x, dst, attrs.get("saturate", 1), attrs.get("round_mode", "up")),)

    return call


register("CastLike", since=15, traits=EW, shape=_castlike_shape, bind=_bind_castlike)(cast_like)


def _bitcast_shape(node: Any) -> list:
    return [(target_dtype(node.attrs["to"]), node.inputs[0].shape)]


@register("BitCast", since=26, traits=EW | Trait.VIEW, shape=_bitcast_shape)
def bitcast(x, *, to):
    """ONNX BitCast: reinterpret the bits as another type of the same width (little endian)."""
    dst = target_dtype(to)
    if dst.torch is None or dst.itemsize != x.element_size():
        raise ModelError(f"BitCast: cannot reinterpret {x.dtype} as {dst.name} "
                         f"(bit widths must match)")
    if dst.torch == torch.bool:
        return x.contiguous().view(torch.uint8).ne(0)
    if x.dtype == torch.bool:
        return x.to(torch.uint8).view(dst.torch)
    return x.contiguous().view(dst.torch)
