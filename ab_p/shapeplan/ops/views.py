"""View ops (Trait.VIEW): Reshape, Squeeze, Unsqueeze, Flatten, Identity -- the input's data under
another shape (ONNX semantics). Shape functions are symbolic; Reshape reads its shape input when it is
a constant and cancels matching symbols when it solves for -1."""
from __future__ import annotations

import math
from typing import Any

import torch

from shapeplan.errors import ExecutionError
from shapeplan.ops._common import const_of, dim_prod, input_at, ints, norm_axis, strings_ok
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import same_as

VDS = Trait.VALUE_DEPENDENT_SHAPE


def _sym_reshape(in_shape: tuple, target: list[int], allowzero: int) -> tuple | None:
    """Output shape of Reshape with symbolic input dims (cancels matching symbols for -1)."""
    out: list[Any] = []
    for i, d in enumerate(target):
        out.append(in_shape[i] if d == 0 and not allowzero else d)
    if -1 not in out:
        return tuple(out)
    num_syms = [d for d in in_shape if not isinstance(d, int)]
    num = dim_prod([d for d in in_shape if isinstance(d, int)])
    den = 1
    den_syms = []
    for d in out:
        if isinstance(d, int):
            if d != -1:
                den *= d
        else:
            den_syms.append(d)
    if None in num_syms or None in den_syms:
        return tuple(None if d == -1 else d for d in out)
    for s in den_syms:
        if s in num_syms:
            num_syms.remove(s)
        else:
            return tuple(None if d == -1 else d for d in out)
    if not num_syms and den and num % den == 0:
        fill: Any = num // den
    elif len(num_syms) == 1 and num == den:
        fill = num_syms[0]
    else:
        fill = None
    return tuple(fill if d == -1 else d for d in out)


# ----------------------------------------------------------------------------- Reshape
def _reshape_target(x: torch.Tensor, shape: list[int], allowzero: int) -> list[int]:
    if allowzero:
        return shape
    return [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]


def _reshape_shape(node: Any) -> list:
    x, s = node.inputs[0], const_of(input_at(node, 1))
    target = ints(s) if s is not None else node.attrs.get("shape")
    if x.shape is None or target is None:
        return [(x.dtype, None)]
    return [(x.dtype, _sym_reshape(x.shape, list(target), node.attrs.get("allowzero", 0)))]


@register("Reshape", since=1, traits=Trait.VIEW, shape=_reshape_shape)
@strings_ok
def reshape_v1(x, *, shape=None, consumed_inputs=None):
    """ONNX Reshape-1 (shape attribute)."""
    return torch.reshape(x, _reshape_target(x, list(shape), 0))


@register("Reshape", since=5, traits=Trait.VIEW | VDS, shape=_reshape_shape, host_inputs=(1,))
@strings_ok
def reshape(x, shape, *, allowzero=0):
    """ONNX Reshape: 0 copies the input dim (unless allowzero), -1 is inferred."""
    return torch.reshape(x, _reshape_target(x, ints(shape), allowzero))


# ----------------------------------------------------------------------------- Squeeze / Unsqueeze / Flatten
def _squeeze_axes(node: Any) -> list[int] | None | str:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if input_at(node, 1) is None:
        return None
    c = const_of(node.inputs[1])
    return ints(c) if c is not None else "unknown"


def _squeeze_shape(node: Any) -> list:
    x = node.inputs[0]
    axes = _squeeze_axes(node)
    if x.shape is None or axes == "unknown":
        return [(x.dtype, None)]
    rank = len(x.shape)
    if axes is None:
        if any(not isinstance(d, int) for d in x.shape):
            return [(x.dtype, None)]
        return [(x.dtype, tuple(d for d in x.shape if d != 1))]
    drop = {a + rank if a < 0 else a for a in axes}  # type: ignore[union-attr]
    return [(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in drop))]


def _squeeze(x: torch.Tensor, axes: list[int] | None) -> torch.Tensor:
    if axes is None:
        return x.reshape([d for d in x.shape if d != 1])
    drop = {norm_axis(a, x.dim(), "Squeeze axis") for a in axes}
    for a in drop:
        if x.shape[a] != 1:
            raise ExecutionError(f"Squeeze: axis {a} has size {x.shape[a]}, expected 1 (shape {list(x.shape)})")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in drop])


@register("Squeeze", since=1, traits=Trait.VIEW, shape=_squeeze_shape)
@strings_ok
def squeeze_v1(x, *, axes=None):
    """ONNX Squeeze-1/11 (axes attribute)."""
    return _squeeze(x, axes)


@register("Squeeze", since=13, traits=Trait.VIEW | VDS, shape=_squeeze_shape, host_inputs=(1,))
@strings_ok
def squeeze(x, axes=None):
    """ONNX Squeeze (axes input; none: drop every size-1 dim)."""
    return _squeeze(x, None if axes is None else ints(axes))


def _unsqueeze_shape(node: Any) -> list:
    x = node.inputs[0]
    axes = _squeeze_axes(node)
    if x.shape is None or axes is None or axes == "unknown":
        return [(x.dtype, None)]
    return [(x.dtype, tuple(_unsqueeze_dims(list(x.shape), axes)))]  # type: ignore[arg-type]


def _unsqueeze_dims(shape: list, axes: list[int]) -> list:
    rank = len(shape) + len(axes)
    add = sorted(norm_axis(a, rank, "Unsqueeze axis") for a in axes)
    if len(set(add)) != len(add):
        raise ExecutionError(f"Unsqueeze: repeated axes {axes}")
    out = list(shape)
    for a in add:
        out.insert(a, 1)
    return out


@register("Unsqueeze", since=1, traits=Trait.VIEW, shape=_unsqueeze_shape)
@strings_ok
def unsqueeze_v1(x, *, axes):
    """ONNX Unsqueeze-1/11 (axes attribute)."""
    return x.reshape(_unsqueeze_dims(list(x.shape), list(axes)))


@register("Unsqueeze", since=13, traits=Trait.VIEW | VDS, shape=_unsqueeze_shape, host_inputs=(1,))
@strings_ok
def unsqueeze(x, axes):
    """ONNX Unsqueeze (axes input, relative to the output rank)."""
    return x.reshape(_unsqueeze_dims(list(x.shape), ints(axes)))


def _flatten_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None)]
    rank = len(x.shape)
    axis = node.attrs.get("axis", 1)
    axis = axis + rank if axis < 0 else axis
    outer, inner = x.shape[:axis], x.shape[axis:]

    def fold(ds: tuple) -> Any:
        p = dim_prod(ds)
        if p is not None:
            return p
        syms = [d for d in ds if not isinstance(d, int) or d != 1]
        return syms[0] if len(syms) == 1 else None

    return [(x.dtype, (fold(outer), fold(inner)))]


@register("Flatten", traits=Trait.VIEW, shape=_flatten_shape)
@strings_ok
def flatten(x, *, axis=1):
    """ONNX Flatten: 2-D [prod(dims[:axis]), prod(dims[axis:])]."""
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


# ----------------------------------------------------------------------------- Identity
@register("Identity", traits=Trait.VIEW, shape=same_as(0))
def identity(x):
    """ONNX Identity (tensors, sequences and optionals alike)."""
    return x
