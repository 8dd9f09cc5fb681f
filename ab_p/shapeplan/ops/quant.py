"""Linear quantization: QuantizeLinear, DequantizeLinear (scalar / per-axis / blocked; int8..int16,
int4/uint4 and float8 types; output_dtype, saturate), DynamicQuantizeLinear.

int4/uint4 values travel in int8/uint8 tensors (torch has no 4-bit dtype); the declared ONNX type
of the zero point (or ``output_dtype``) decides the clamping range.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ExecutionError
from shapeplan.ir.dtypes import DType, dtype as as_dtype
from shapeplan.ops.registry import register
from shapeplan.ops._common import norm_axis

_INT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
               "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1), "int32": (-2 ** 31, 2 ** 31 - 1)}
_CARRIER = {"uint4": torch.uint8, "int4": torch.int8, "uint2": torch.uint8, "int2": torch.int8}


def _round_float4e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest float4 e2m1 value (ties to even mantissa), saturating at ±6.
    The grid is 0, 0.5, 1, 1.5, 2, 3, 4, 6: step 0.5 below 2, 1 below 4, 2 above."""
    a = v.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(v.dtype)
    return (torch.round(a / step) * step).clamp(max=6.0).copysign(v)


def _broadcast_param(p: torch.Tensor, x: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """Scale / zero point -> broadcastable to x: scalar, per-axis (1-D) or blocked (same rank)."""
    if p.dim() == 0 or p.numel() == 1 and not block_size:
        return p.reshape(())
    axis = norm_axis(axis, x.dim(), "quantization axis")
    if not block_size:
        if p.dim() != 1 or p.shape[0] != x.shape[axis]:
            raise ExecutionError(f"per-axis quantization parameter has shape {list(p.shape)}, expected "
                                 f"[{x.shape[axis]}] (axis {axis} of x {list(x.shape)})")
        shape = [1] * x.dim()
        shape[axis] = p.shape[0]
        return p.reshape(shape)
    if p.dim() != x.dim():
        raise ExecutionError(f"blocked quantization parameter has rank {p.dim()}, x has rank {x.dim()}")
    return p.repeat_interleave(block_size, dim=axis).narrow(axis, 0, x.shape[axis])


def _declared(node: Any, i: int) -> DType | None:
    if node is None or i >= len(node.inputs) or node.inputs[i] is None:
        return None
    return node.inputs[i].dtype


def _quantize(x, y_scale, y_zero_point, axis, saturate, block_size, output_dtype, precision, node):  # noqa: ANN001, ANN202
    zp_type = _declared(node, 2)
    if y_zero_point is not None:
        out_t = zp_type or as_dtype(y_zero_point.dtype)
    elif output_dtype:
        out_t = as_dtype(output_dtype)
    else:
        out_t = as_dtype("uint8")
    scale = _broadcast_param(y_scale, x, axis, block_size)
    if precision:
        pt = as_dtype(precision).torch
        q = x.to(pt) / scale.to(pt)
    else:
        q = x / scale.to(x.dtype) if x.dtype.is_floating_point else x / scale
    if out_t.name in _INT_RANGES:
        lo, hi = _INT_RANGES[out_t.name]
        qi = torch.round(q).to(torch.int64)
        if y_zero_point is not None:
            qi = qi + _broadcast_param(y_zero_point, x, axis, block_size).to(torch.int64)
        return qi.clamp(lo, hi).to(_CARRIER.get(out_t.name) or out_t.torch)
    if out_t.name.startswith("float8") and out_t.torch is not None:
        q = q.to(torch.float32)
        if saturate:                             # as the ONNX reference: clip, infinities included
            fi = torch.finfo(out_t.torch)
            q = q.clamp(fi.min, fi.max)
        elif out_t.name == "float8e4m3fn":         # torch's cast saturates; ONNX wants NaN past max
            q = torch.where(q.abs() > 464.0, torch.full_like(q, float("nan")), q)
        return q.to(out_t.torch)
    if out_t.name == "float4e2m1":                 # runs widened in float32
        if y_zero_point is not None:
            q = q + _broadcast_param(y_zero_point, x, axis, block_size).to(q.dtype)
        return _round_float4e2m1(q.to(torch.float32))
    raise ExecutionError(f"QuantizeLinear: unsupported output type {out_t.name}")


@register("QuantizeLinear", since=10)
def quantize_linear_v10(x, y_scale, y_zero_point=None, *, axis=1, _node=None):
    """ONNX QuantizeLinear-10/13."""
    return _quantize(x, y_scale, y_zero_point, axis, 1, 0, None, None, _node)


@register("QuantizeLinear", since=19)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0, _node=None):
    """ONNX QuantizeLinear: y = saturate(round_half_even(x / scale) + zero_point)."""
    return _quantize(x, y_scale, y_zero_point, axis, saturate, block_size, output_dtype, precision, _node)


def _dequantize(x, x_scale, x_zero_point, axis, block_size, output_dtype, node):  # noqa: ANN001, ANN202
    dx = x.to(torch.float32)
    x_type = _declared(node, 0) or as_dtype(x.dtype)
    if x_zero_point is not None and not x_type.name.startswith(("float8", "float4")):
        dx = dx - _broadcast_param(x_zero_point, x, axis, block_size).to(torch.float32)
    y = dx * _broadcast_param(x_scale, x, axis, block_size)
    out = as_dtype(output_dtype).torch if output_dtype else x_scale.dtype
    return y.to(out)


@register("DequantizeLinear", since=10)
def dequantize_linear_v10(x, x_scale, x_zero_point=None, *, axis=1, _node=None):
    """ONNX DequantizeLinear-10/13/19."""
    return _dequantize(x, x_scale, x_zero_point, axis, 0, 0, _node)


@register("DequantizeLinear", since=21)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0,
                      _node=None):
    """ONNX DequantizeLinear: y = (x - zero_point) * scale, in the scale's type (or output_dtype)."""
    return _dequantize(x, x_scale, x_zero_point, axis, block_size, output_dtype, _node)


@register("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    """ONNX DynamicQuantizeLinear: uint8 y, float scale, uint8 zero point from x's range."""
    xf = x.to(torch.float32)
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    maxx = torch.maximum(zero, xf.max()) if xf.numel() else zero
    minx = torch.minimum(zero, xf.min()) if xf.numel() else zero
    rng = torch.where(maxx == minx, torch.ones_like(maxx), maxx - minx)
    scale = rng / 255.0
    zp = torch.round((0.0 - minx / scale).clamp(0, 255))
    y = (torch.round(xf / scale) + zp).clamp(0, 255)
    return y.to(torch.uint8), scale.to(x.dtype), zp.to(torch.uint8)
