"""Tensor data movement: Transpose, Concat, Split, Slice, Expand, Tile, Where, Trilu, ReverseSequence
(ONNX semantics).

Shape functions are symbolic where the output shape follows from input shapes alone; where it follows
from an input's *value* (Slice's starts, Expand's shape) they read it when that input is a constant.
The family's other modules: ops/views.py (Reshape, Squeeze, Unsqueeze, Flatten, Identity),
ops/padding.py (Pad, CenterCropPad), ops/blocks.py (DepthToSpace, SpaceToDepth, Col2Im). The argument
helpers live in ops/_common.py; they are re-exported here, where other op modules have imported them.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ExecutionError
from shapeplan.ops._common import const_of, dim_prod, input_at, ints, norm_axis, strings_ok
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import broadcast, broadcast_shapes, same_as

__all__ = ["const_of", "dim_prod", "ints", "norm_axis", "strings_ok"]   # re-exported helpers

VDS = Trait.VALUE_DEPENDENT_SHAPE


# ----------------------------------------------------------------------------- Transpose / Concat
def _transpose_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None)]
    perm = node.attrs.get("perm") or list(range(len(x.shape)))[::-1]
    return [(x.dtype, tuple(x.shape[p] for p in perm))]


@register("Transpose", traits=Trait.NONE, shape=_transpose_shape)
@strings_ok
def transpose(x, *, perm=None):
    """ONNX Transpose (default: reverse the axes)."""
    return x.permute(*(perm if perm is not None else range(x.dim() - 1, -1, -1)))


def _concat_shape(node: Any) -> list:
    ins = [v for v in node.inputs if v is not None]
    if any(v.shape is None for v in ins):
        return [(ins[0].dtype, None)]
    rank = len(ins[0].shape)
    axis = node.attrs.get("axis", 1)
    axis = axis + rank if axis < 0 else axis
    out = list(ins[0].shape)
    for d in range(rank):
        col = [v.shape[d] for v in ins]
        if d == axis:
            out[d] = sum(col) if all(isinstance(c, int) for c in col) else None
        else:
            known = [c for c in col if c is not None]
            ints_ = [c for c in known if isinstance(c, int)]
            out[d] = ints_[0] if ints_ else (known[0] if known else None)
    return [(ins[0].dtype, tuple(out))]


@register("Concat", since=1, shape=_concat_shape)
@strings_ok
def concat(*xs, axis=1):
    """ONNX Concat."""
    return torch.cat(xs, dim=axis)


@register("Concat", since=4, shape=_concat_shape)
@strings_ok
def concat_v4(*xs, axis):
    """ONNX Concat (axis required)."""
    return torch.cat(xs, dim=axis)


# ----------------------------------------------------------------------------- Split
def _split_sizes(dim: int, split: list[int] | None, n_out: int, num_outputs: int | None) -> list[int]:
    if split is not None and len(split):
        return split
    n = num_outputs or n_out
    chunk = -(-dim // n)
    sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    return sizes


def _split_shape(node: Any) -> list:
    x = node.inputs[0]
    n = len(node.outputs)
    if x.shape is None:
        return [(x.dtype, None)] * n
    axis = node.attrs.get("axis", 0)
    axis = axis + len(x.shape) if axis < 0 else axis
    sp = const_of(input_at(node, 1))
    split = ints(sp) if sp is not None else node.attrs.get("split")
    if input_at(node, 1) is not None and sp is None:
        return [(x.dtype, None)] * n
    dim = x.shape[axis]
    if split is None and not isinstance(dim, int):
        return [(x.dtype, None)] * n
    sizes = _split_sizes(dim, split, n, node.attrs.get("num_outputs"))  # type: ignore[arg-type]
    return [(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes]


def _split(x: torch.Tensor, split: Any, axis: int, n_out: int, num_outputs: Any = None) -> tuple:
    axis = norm_axis(axis, x.dim())
    sizes = _split_sizes(x.shape[axis], ints(split) if split is not None else None, n_out, num_outputs)
    return tuple(torch.split(x, sizes, dim=axis))


@register("Split", since=1, shape=_split_shape, host_inputs=(1,))
@strings_ok
def split_v1(x, split_in=None, *, axis=0, split=None, _n_out):
    """ONNX Split-1/2/11 (split as attribute; Split-1 also takes it as an input)."""
    return _split(x, split if split is not None else split_in, axis, _n_out)


@register("Split", since=13, shape=_split_shape, host_inputs=(1,))
@strings_ok
def split_v13(x, split=None, *, axis=0, _n_out):
    """ONNX Split-13 (split as input)."""
    return _split(x, split, axis, _n_out)


@register("Split", since=18, shape=_split_shape, host_inputs=(1,))
@strings_ok
def split_v18(x, split=None, *, axis=0, num_outputs=None, _n_out):
    """ONNX Split-18: num_outputs splits into ceil-sized chunks, the last one smaller."""
    return _split(x, split, axis, _n_out, num_outputs)


# ----------------------------------------------------------------------------- Slice
def _slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    if step == 0:
        raise ExecutionError("Slice: a step of 0 is invalid")
    return slice(start, end, step).indices(dim)


def _slice(x: torch.Tensor, starts: list[int], ends: list[int], axes: list[int] | None,
           steps: list[int] | None) -> torch.Tensor:
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    idx: list[Any] = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.dim(), "Slice axis")
        b, en, st = _slice_bounds(x.shape[a], s, e, st)
        if st > 0:
            idx[a] = slice(b, max(en, b), st)
        else:                                   # torch has no negative steps: slice the flipped axis
            n = x.shape[a]
            fb, fe = n - 1 - b, n - 1 - en
            idx[a] = slice(fb, max(fe, fb), -st)
            flips.append(a)
    if flips:
        x = x.flip(flips)
    return x[tuple(idx)]


def _slice_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None)]
    if "starts" in node.attrs:
        starts, ends, axes, steps = (node.attrs.get("starts"), node.attrs.get("ends"),
                                     node.attrs.get("axes"), None)
    else:
        vals = [const_of(input_at(node, i)) for i in range(1, 5)]
        for i in range(1, 5):
            if input_at(node, i) is not None and vals[i - 1] is None:
                return [(x.dtype, tuple([None] * len(x.shape)))]
        starts, ends = ints(vals[0]), ints(vals[1])
        axes = ints(vals[2]) if vals[2] is not None else None
        steps = ints(vals[3]) if vals[3] is not None else None
    rank = len(x.shape)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    out = list(x.shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a + rank if a < 0 else a
        d = x.shape[a]
        if isinstance(d, int):
            out[a] = len(range(*_slice_bounds(d, s, e, st)))
        elif s == 0 and st == 1 and e >= 2 ** 62:
            out[a] = d
        else:
            out[a] = None
    return [(x.dtype, tuple(out))]


@register("Slice", since=1, shape=_slice_shape)
@strings_ok
def slice_v1(x, *, starts, ends, axes=None):
    """ONNX Slice-1 (attributes)."""
    return _slice(x, list(starts), list(ends), axes, None)


@register("Slice", since=10, traits=VDS, shape=_slice_shape, host_inputs=(1, 2, 3, 4))
@strings_ok
def slice_(x, starts, ends, axes=None, steps=None):
    """ONNX Slice (inputs; Python slice semantics, negative steps allowed)."""
    return _slice(x, ints(starts), ints(ends), None if axes is None else ints(axes),
                  None if steps is None else ints(steps))


# ----------------------------------------------------------------------------- Expand / Tile
def _expand_shape(node: Any) -> list:
    x, s = node.inputs[0], const_of(node.inputs[1])
    if s is None or x.shape is None:
        return [(x.dtype, None)]
    return [(x.dtype, broadcast_shapes(x.shape, tuple(ints(s)), where=f"node {node.describe()}: "))]


@register("Expand", since=8, traits=VDS, shape=_expand_shape, host_inputs=(1,))
@strings_ok
def expand(x, shape):
    """ONNX Expand: bidirectional broadcast of x to ``shape``."""
    out = torch.broadcast_shapes(tuple(x.shape), tuple(ints(shape)))
    return x.expand(out).contiguous()


def _tile_shape(node: Any) -> list:
    x, r = node.inputs[0], const_of(node.inputs[1])
    if r is None or x.shape is None:
        return [(x.dtype, None)]
    reps = ints(r)
    return [(x.dtype, tuple(d * k if isinstance(d, int) else (d if k == 1 else None)
                            for d, k in zip(x.shape, reps)))]


@register("Tile", since=6, traits=VDS, shape=_tile_shape, host_inputs=(1,))
@strings_ok
def tile(x, repeats):
    """ONNX Tile."""
    return x.repeat(ints(repeats)) if x.dim() else x.clone()


# ----------------------------------------------------------------------------- Where / Trilu
@register("Where", since=9, traits=Trait.ELEMENTWISE, shape=broadcast(dtype_from=1))
@strings_ok
def where(cond, x, y):
    """ONNX Where."""
    return torch.where(cond.to(torch.bool), x, y)


@register("Trilu", since=14, shape=same_as(0), host_inputs=(1,))
def trilu(x, k=None, *, upper=1):
    """ONNX Trilu: keep the upper (triu) or lower (tril) triangle of the last two dims."""
    kk = int(k.reshape(-1)[0].item()) if k is not None else 0
    return torch.triu(x, kk) if upper else torch.tril(x, kk)


# ----------------------------------------------------------------------------- ReverseSequence
@register("ReverseSequence", since=10, shape=same_as(0))
@strings_ok
def reverse_sequence(x, sequence_lens, *, batch_axis=1, time_axis=0):
    """ONNX ReverseSequence: reverse the first seq_len[b] steps of every batch entry."""
    t = torch.arange(x.shape[time_axis], device=x.device)
    lens = sequence_lens.to(device=x.device, dtype=torch.int64)
    grid_t = t.view(-1, 1) if time_axis < batch_axis else t.view(1, -1)
    grid_l = lens.view(1, -1) if time_axis < batch_axis else lens.view(-1, 1)
    src = torch.where(grid_t < grid_l, grid_l - 1 - grid_t, grid_t)       # [T, B] or [B, T]
    shape = [1] * x.dim()
    shape[time_axis], shape[batch_axis] = x.shape[time_axis], x.shape[batch_axis]
    return torch.gather(x, time_axis, src.reshape(shape).expand(x.shape))
