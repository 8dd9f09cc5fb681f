"""Tensor manipulation: reshape/transpose/concat/split/slice/squeeze/pad/... (ONNX semantics).

Shape functions are symbolic where the output shape follows from input shapes alone; where it follows
from an input's *value* (Reshape's shape, Slice's starts) they read it when that input is a constant.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from shapeplan.errors import ExecutionError
from shapeplan.ir.graph import ValueKind
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import broadcast, broadcast_shapes, same_as

VDS = Trait.VALUE_DEPENDENT_SHAPE


# ----------------------------------------------------------------------------- helpers (shared)
def const_of(v: Any) -> Any:
    """The compile-time value of Value ``v`` (an initializer or a Constant node's output), else None."""
    if v is None:
        return None
    if v.kind is ValueKind.CONSTANT and v.data is not None:
        return v.data
    p = v.producer
    if p is not None and p.op_type == "Constant" and not p.domain:
        for key in ("value", "value_int", "value_ints", "value_float", "value_floats"):
            if key in p.attrs:
                val = p.attrs[key]
                return val if isinstance(val, torch.Tensor) else torch.tensor(val)
    return None


def ints(t: Any) -> list[int]:
    """An int64 tensor / list / scalar -> list of Python ints (one host read)."""
    if isinstance(t, torch.Tensor):
        return [int(i) for i in t.reshape(-1).tolist()]
    if isinstance(t, (list, tuple)):
        return [int(i) for i in t]
    return [int(t)]


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ExecutionError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def dim_prod(dims: Any) -> Any:
    """Product of dims; None when any dim is not a concrete int."""
    out = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        out *= d
    return out


def strings_ok(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Let a pure data-movement kernel run on ONNX string tensors (numpy object arrays): the strings
    become int64 codes into one table, the kernel moves the codes, and the outputs are decoded."""

    @functools.wraps(fn)
    def kernel(*args: Any, **kw: Any) -> Any:
        if not any(isinstance(a, np.ndarray) and a.dtype == object for a in args):
            return fn(*args, **kw)
        table: list[Any] = []
        coded = []
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype == object:
                coded.append(torch.arange(len(table), len(table) + a.size, dtype=torch.int64).reshape(a.shape))
                table.extend(a.reshape(-1).tolist())
            else:
                coded.append(a)
        lut = np.empty(len(table), dtype=object)
        lut[:] = table

        def decode(t: torch.Tensor) -> np.ndarray:
            return lut[t.reshape(-1).cpu().numpy()].reshape(tuple(t.shape))

        out = fn(*coded, **kw)
        return tuple(decode(o) for o in out) if isinstance(out, tuple) else decode(out)

    return kernel


def _in(node: Any, i: int) -> Any:
    return node.inputs[i] if i < len(node.inputs) else None


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
    x, s = node.inputs[0], const_of(_in(node, 1))
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
    sp = const_of(_in(node, 1))
    split = ints(sp) if sp is not None else node.attrs.get("split")
    if _in(node, 1) is not None and sp is None:
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
        vals = [const_of(_in(node, i)) for i in range(1, 5)]
        for i in range(1, 5):
            if _in(node, i) is not None and vals[i - 1] is None:
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


# ----------------------------------------------------------------------------- Squeeze / Unsqueeze / Flatten
def _squeeze_axes(node: Any) -> list[int] | None | str:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if _in(node, 1) is None:
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


# ----------------------------------------------------------------------------- Pad
def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i.remainder(n)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = i.remainder(period)
    return torch.where(i >= n, period - i, i)


def _pad(x: torch.Tensor, pads: list[int], mode: str, value: Any, axes: list[int] | None) -> torch.Tensor:
    rank = x.dim()
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank, "Pad axis") for a in axes]
    k = len(axes)
    if len(pads) != 2 * k:
        raise ExecutionError(f"Pad: expected {2 * k} pads for {k} axes, got {len(pads)}")
    per_axis = {a: (pads[i], pads[k + i]) for i, a in enumerate(axes)}
    # negative pads crop first
    idx = [slice(max(-per_axis.get(a, (0, 0))[0], 0), x.shape[a] - max(-per_axis.get(a, (0, 0))[1], 0))
           for a in range(rank)]
    x = x[tuple(idx)]
    grow = {a: (max(b, 0), max(e, 0)) for a, (b, e) in per_axis.items() if b > 0 or e > 0}
    if not grow:
        return x.clone()
    if mode == "constant":
        flat: list[int] = []
        for a in range(rank - 1, -1, -1):
            flat += list(grow.get(a, (0, 0)))
        v = value.reshape(-1)[0].item() if isinstance(value, torch.Tensor) and value.numel() else (value or 0)
        if x.dtype == torch.bool:
            out = F.pad(x.to(torch.uint8), flat, value=int(bool(v)))
            return out.to(torch.bool)
        return F.pad(x, flat, mode="constant", value=v)
    if mode not in ("edge", "reflect", "wrap"):
        raise ExecutionError(f"Pad: unknown mode {mode!r}; expected constant, reflect, edge or wrap")
    for a, (b, e) in grow.items():
        if x.shape[a] == 0:
            raise ExecutionError(f"Pad: cannot {mode}-pad axis {a} of size 0")
        x = x.index_select(a, _pad_index(x.shape[a], b, e, mode, x.device))
    return x


def _pad_shape(node: Any) -> list:
    x = node.inputs[0]
    if "pads" in node.attrs or "paddings" in node.attrs:
        pads = list(node.attrs.get("pads") or node.attrs.get("paddings"))
        axes = None
    else:
        p, ax = const_of(node.inputs[1]), const_of(_in(node, 3))
        if p is None or (_in(node, 3) is not None and ax is None):
            return [(x.dtype, None if x.shape is None else tuple([None] * len(x.shape)))]
        pads, axes = ints(p), (ints(ax) if ax is not None else None)
    if x.shape is None:
        return [(x.dtype, None)]
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    out = list(x.shape)
    k = len(axes)
    for i, a in enumerate(axes):
        add = pads[i] + pads[k + i]
        out[a] = out[a] + add if isinstance(out[a], int) else (out[a] if add == 0 else None)
    return [(x.dtype, tuple(out))]


@register("Pad", since=1, shape=_pad_shape)
def pad_v1(x, *, pads=None, paddings=None, mode="constant", value=0.0):
    """ONNX Pad-1/2 (pads attribute)."""
    return _pad(x, list(pads if pads is not None else paddings), mode, value, None)


@register("Pad", since=11, traits=VDS, shape=_pad_shape, host_inputs=(1, 2, 3))
def pad(x, pads, constant_value=None, axes=None, *, mode="constant"):
    """ONNX Pad: constant / reflect / edge / wrap; negative pads crop; optional axes (18)."""
    return _pad(x, ints(pads), mode, constant_value, None if axes is None else ints(axes))


# ----------------------------------------------------------------------------- Identity / Where / Trilu
@register("Identity", traits=Trait.VIEW, shape=same_as(0))
def identity(x):
    """ONNX Identity (tensors, sequences and optionals alike)."""
    return x


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


# ----------------------------------------------------------------------------- DepthToSpace / SpaceToDepth
def _d2s_shape(node: Any) -> list:
    x, b = node.inputs[0], node.attrs["blocksize"]
    if x.shape is None:
        return [(x.dtype, None)]
    n, c, h, w = x.shape
    f = lambda d, k: d * k if isinstance(d, int) else None  # noqa: E731
    g = lambda d, k: d // k if isinstance(d, int) else None  # noqa: E731
    if node.op_type == "DepthToSpace":
        return [(x.dtype, (n, g(c, b * b), f(h, b), f(w, b)))]
    return [(x.dtype, (n, f(c, b * b), g(h, b), g(w, b)))]


@register("DepthToSpace", since=1, shape=_d2s_shape)
def depth_to_space(x, *, blocksize, mode="DCR"):
    """ONNX DepthToSpace (DCR or CRD). x: [N, C, H, W] -> [N, C/b², H*b, W*b]."""
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth", since=1, shape=_d2s_shape)
def space_to_depth(x, *, blocksize, mode="DCR"):
    """ONNX SpaceToDepth (DCR, or CRD from opset 28). x: [N, C, H, W] -> [N, C*b², H/b, W/b]."""
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


# ----------------------------------------------------------------------------- CenterCropPad / Col2Im
@register("CenterCropPad", since=18, traits=VDS, host_inputs=(1,))
def center_crop_pad(x, shape, *, axes=None):
    """ONNX CenterCropPad: crop or zero-pad each axis around its centre."""
    rank = x.dim()
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank) for a in axes]
    target = ints(shape)
    new_shape = list(x.shape)
    crop = [slice(None)] * rank
    place = [slice(None)] * rank
    for a, t in zip(axes, target):
        d = x.shape[a]
        new_shape[a] = t
        if t < d:
            s = (d - t) // 2
            crop[a] = slice(s, s + t)
        elif t > d:
            s = (t - d) // 2
            place[a] = slice(s, s + d)
    out = torch.zeros(new_shape, dtype=x.dtype, device=x.device)
    out[tuple(place)] = x[tuple(crop)]
    return out


@register("Col2Im", since=18, traits=VDS, host_inputs=(1, 2))
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im: sum sliding blocks [N, C*prod(block), L] back into an image [N, C, *image]."""
    img, blk = ints(image_shape), ints(block_shape)
    nd = len(img)
    dil = dilations or [1] * nd
    st = strides or [1] * nd
    pd = pads or [0] * (2 * nd)
    padded = [img[i] + pd[i] + pd[i + nd] for i in range(nd)]
    nblk = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    n, ck, length = x.shape
    c = ck // math.prod(blk)
    if length != math.prod(nblk):
        raise ExecutionError(f"Col2Im: input has {length} blocks, image/block/strides give {nblk}")
    dev = x.device
    # padded-image coordinate of (kernel offset k, block position l) per dim: l*stride + k*dilation
    lin = torch.zeros((), dtype=torch.int64, device=dev)
    for i in range(nd):
        k = torch.arange(blk[i], device=dev) * dil[i]
        lpos = torch.arange(nblk[i], device=dev) * st[i]
        coord = k.view(-1, 1) + lpos.view(1, -1)                       # [k_i, l_i]
        shape_k = [1] * (2 * nd)
        shape_k[i], shape_k[nd + i] = blk[i], nblk[i]
        lin = lin * padded[i] + coord.reshape(shape_k)
    lin = lin.reshape(-1)                                              # [prod(k) * prod(l)]
    out = torch.zeros(n, c, math.prod(padded), dtype=x.dtype, device=dev)
    out.index_add_(2, lin, x.reshape(n, c, -1))
    out = out.reshape(n, c, *padded)
    crop = tuple(slice(pd[i], pd[i] + img[i]) for i in range(nd))
    return out[(slice(None), slice(None)) + crop].contiguous()
