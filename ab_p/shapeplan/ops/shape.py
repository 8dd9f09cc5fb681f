"""Shape and value-creating ops: Shape, Size, Constant, ConstantOfShape, Range, EyeLike, OneHot."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from shapeplan.errors import ExecutionError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops.registry import Trait, register
from shapeplan.ops._common import const_of, ints, norm_axis

INT64 = as_dtype("int64")


# ----------------------------------------------------------------------------- Shape / Size
def _shape_range(rank: int, start: int, end: int | None) -> range:
    return range(*slice(start, end).indices(rank))


def _shape_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(INT64, None)]
    n = len(_shape_range(len(x.shape), node.attrs.get("start", 0), node.attrs.get("end")))
    return [(INT64, (n,))]


@register("Shape", traits=Trait.SHAPE_ONLY_OUTPUT, shape=_shape_shape)
def shape(x, *, start=0, end=None):
    """ONNX Shape (start/end from opset 15, clamped like a Python slice)."""
    dims = list(x.shape)[slice(start, end)]
    dev = x.device if isinstance(x, torch.Tensor) else None
    return torch.tensor(dims, dtype=torch.int64, device=dev)


@register("Size", traits=Trait.SHAPE_ONLY_OUTPUT, shape=lambda node: [(INT64, ())])
def size(x):
    """ONNX Size: the number of elements, as an int64 scalar."""
    n = math.prod(x.shape)
    dev = x.device if isinstance(x, torch.Tensor) else None
    return torch.tensor(n, dtype=torch.int64, device=dev)


# ----------------------------------------------------------------------------- Constant
def _constant_value(attrs: dict[str, Any]) -> Any:
    if len(attrs) != 1:
        raise ExecutionError(f"Constant needs exactly one value_* attribute, got {sorted(attrs) or 'none'}")
    key, v = next(iter(attrs.items()))
    if key in ("value", "sparse_value"):
        if not isinstance(v, (torch.Tensor, np.ndarray)):
            from onnx import numpy_helper
            from shapeplan.ir.tensors import numpy_to_runtime
            return numpy_to_runtime(numpy_helper.to_array(v))
        return v
    if key == "value_float":
        return torch.tensor(float(v), dtype=torch.float32)
    if key == "value_floats":
        return torch.tensor(list(v), dtype=torch.float32).reshape(len(v))
    if key == "value_int":
        return torch.tensor(int(v), dtype=torch.int64)
    if key == "value_ints":
        return torch.tensor(list(v), dtype=torch.int64).reshape(len(v))
    if key == "value_string":
        return np.array(v, dtype=object)
    if key == "value_strings":
        return np.array(list(v), dtype=object).reshape(len(v))
    raise ExecutionError(f"Constant: unknown attribute {key!r}")


def _constant_shape(node: Any) -> list:
    v = _constant_value(node.attrs)
    if isinstance(v, np.ndarray):
        return [(as_dtype("string"), tuple(v.shape))]
    return [(as_dtype(v.dtype), tuple(v.shape))]


@register("Constant", traits=Trait.CREATES_VALUE, shape=_constant_shape)
def constant(**attrs):
    """ONNX Constant: value / sparse_value / value_float(s) / value_int(s) / value_string(s)."""
    return _constant_value(attrs)


# ----------------------------------------------------------------------------- ConstantOfShape
def _fill_value(value: Any) -> tuple[Any, torch.dtype]:
    if value is None:
        return 0.0, torch.float32
    return value.reshape(-1)[0].item(), value.dtype


def _cos_shape(node: Any) -> list:
    val = node.attrs.get("value")
    dt = as_dtype(val.dtype) if val is not None else as_dtype("float32")
    s = const_of(node.inputs[0])
    if s is not None:
        return [(dt, tuple(ints(s)))]
    x = node.inputs[0]
    n = x.shape[0] if x.shape is not None and len(x.shape) == 1 else None
    return [(dt, tuple([None] * n) if isinstance(n, int) else None)]


@register("ConstantOfShape", since=9,
          traits=Trait.CREATES_VALUE | Trait.VALUE_DEPENDENT_SHAPE, shape=_cos_shape)
def constant_of_shape(shape, *, value=None):
    """ONNX ConstantOfShape: a tensor of ``shape`` filled with ``value`` (default float32 0)."""
    fill, dt = _fill_value(value)
    return torch.full(ints(shape), fill, dtype=dt, device=shape.device)


# ----------------------------------------------------------------------------- Range
def _range_shape(node: Any) -> list:
    s, l_, d = (const_of(v) for v in node.inputs)
    dt = node.inputs[0].dtype
    if s is None or l_ is None or d is None:
        return [(dt, (None,))]
    return [(dt, (_range_len(s.item(), l_.item(), d.item()),))]


def _range_len(start: Any, limit: Any, delta: Any) -> int:
    if delta == 0:
        raise ExecutionError("Range: delta must not be 0")
    return max(int(math.ceil((limit - start) / delta)), 0)


@register("Range", since=11, traits=Trait.CREATES_VALUE | Trait.VALUE_DEPENDENT_SHAPE, shape=_range_shape)
def range_(start, limit, delta, *, stash_type=1):
    """ONNX Range: start + i * delta for i in [0, ceil((limit - start) / delta))."""
    s, l_, d = start.item(), limit.item(), delta.item()
    n = _range_len(s, l_, d)
    if not start.dtype.is_floating_point:
        return torch.arange(s, s + n * d, d, dtype=start.dtype, device=start.device)[:n]
    i = torch.arange(n, dtype=torch.float64, device=start.device)
    return (s + i * d).to(start.dtype)


# ----------------------------------------------------------------------------- EyeLike
def _eyelike_shape(node: Any) -> list:
    x = node.inputs[0]
    dt = as_dtype(node.attrs["dtype"]) if node.attrs.get("dtype") is not None else x.dtype
    return [(dt, x.shape)]


@register("EyeLike", since=9, traits=Trait.CREATES_VALUE, shape=_eyelike_shape)
def eye_like(x, *, dtype=None, k=0):
    """ONNX EyeLike: ones on the k-th diagonal of a 2-D tensor shaped like x."""
    dt = as_dtype(dtype).torch if dtype is not None else x.dtype
    rows, cols = (x.shape[0], x.shape[0]) if x.dim() == 1 else tuple(x.shape)
    i = torch.arange(rows, device=x.device).view(-1, 1)
    j = torch.arange(cols, device=x.device).view(1, -1)
    return (j - i == k).to(dt)


# ----------------------------------------------------------------------------- OneHot
def _onehot_shape(node: Any) -> list:
    idx, depth, values = node.inputs
    dt = values.dtype
    if idx.shape is None:
        return [(dt, None)]
    d = const_of(depth)
    dim = int(d.reshape(-1)[0].item()) if d is not None else None
    rank = len(idx.shape) + 1
    axis = node.attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    out = list(idx.shape)
    out.insert(axis, dim)
    return [(dt, tuple(out))]


@register("OneHot", since=9, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_onehot_shape,
          host_inputs=(1,))
def one_hot(indices, depth, values, *, axis=-1):
    """ONNX OneHot: negative indices count from ``depth``; out-of-range indices give all off."""
    d = int(depth.reshape(-1)[0].item())
    rank = indices.dim() + 1
    axis = norm_axis(axis, rank, "OneHot axis")
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + d, idx).unsqueeze(axis)
    view = [1] * rank
    view[axis] = d
    classes = torch.arange(d, device=indices.device).view(view)
    vals = values.reshape(-1)
    return torch.where(idx == classes, vals[1], vals[0])
