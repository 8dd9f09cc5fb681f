"""Reductions: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare}, ArgMax/ArgMin,
CumSum, CumProd.

Axes: an attribute up to opset 12 (ReduceSum) / 17 (the others), an optional int64 input from then
on. No axes reduces everything, unless ``noop_with_empty_axes=1``: then the op is its elementwise
part only (ReduceSumSquare -> x*x, ReduceL1 -> |x|, ReduceSum -> x), as in the ONNX reference.
Reducing an empty set gives the identity of the reduction (0, 1, -inf, +inf; NaN for the mean).
Integer inputs keep their dtype (means and norms truncate, as numpy's astype does).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.graph import ValueKind
from shapeplan.ops._numeric import norm_axis, uint_safe, widen
from shapeplan.ops.registry import Trait, register

RED = Trait.REDUCTION


# ----------------------------------------------------------------------------------- shapes

def _const_ints(v: Any) -> list[int] | None:
    if v is None:
        return []
    if v.kind is ValueKind.CONSTANT and isinstance(v.data, torch.Tensor):
        return [int(a) for a in v.data.reshape(-1).tolist()]
    return None


def reduce_shape(node: Any) -> list:
    """Symbolic output shape of a Reduce* node (axes from the attribute or a constant input)."""
    x = node.inputs[0]
    keepdims = node.attrs.get("keepdims", 1)
    if len(node.inputs) > 1:
        axes = _const_ints(node.inputs[1])
    else:
        axes = node.attrs.get("axes")
        axes = [] if axes is None else list(axes)
    if x.shape is None or axes is None:
        return [(x.dtype, None)]
    rank = len(x.shape)
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return [(x.dtype, x.shape)]
        axes = list(range(rank))
    where = f"node {node.describe()}: axes"
    red = {norm_axis(a, rank, where) for a in axes}
    if keepdims:
        return [(x.dtype, tuple(1 if i in red else d for i, d in enumerate(x.shape)))]
    return [(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in red))]


def _arg_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(as_dtype("int64"), None)]
    rank = len(x.shape)
    a = norm_axis(node.attrs.get("axis", 0), rank, f"node {node.describe()}: axis")
    if node.attrs.get("keepdims", 1):
        return [(as_dtype("int64"), tuple(1 if i == a else d for i, d in enumerate(x.shape)))]
    return [(as_dtype("int64"), tuple(d for i, d in enumerate(x.shape) if i != a))]


# ----------------------------------------------------------------------------------- kernels

def _dims(x: torch.Tensor, axes: Any, noop: int) -> tuple[int, ...] | None:
    """Reduced dims (sorted); () = no reduction (noop); None never returned for rank > 0."""
    if isinstance(axes, torch.Tensor):
        axes = axes.reshape(-1).tolist()
    if axes is None or len(axes) == 0:
        return () if noop else tuple(range(x.dim()))
    return tuple(sorted({norm_axis(int(a), x.dim(), "Reduce axes") for a in axes}))


def _empty_fill(x: torch.Tensor, dims: tuple[int, ...], keepdims: int, value: float) -> torch.Tensor:
    shape = [1 if i in dims else d for i, d in enumerate(x.shape)] if keepdims else \
        [d for i, d in enumerate(x.shape) if i not in dims]
    return torch.full(shape, value, dtype=x.dtype, device=x.device)


def _lowest(dt: torch.dtype) -> float:
    return float("-inf") if dt.is_floating_point else torch.iinfo(dt).min


def _highest(dt: torch.dtype) -> float:
    return float("inf") if dt.is_floating_point else torch.iinfo(dt).max


def _sum(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.sum(x.float(), dims, keep).to(x.dtype)
    return torch.sum(x, dims, keep, dtype=x.dtype if x.dtype != torch.bool else torch.int64)


def _prod(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    y = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    for d in sorted(dims, reverse=True):
        y = torch.prod(y, d, keepdim=True)
    if not keep:
        y = y.squeeze(dims) if dims else y
    return y.to(x.dtype)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype.is_floating_point and x.dtype not in (torch.float16, torch.bfloat16) \
        else x.to(torch.float64 if not x.dtype.is_floating_point else torch.float32)


# kind -> (elementwise pre, reduction over dims, elementwise post, empty-set value)
_KINDS: dict[str, tuple[Callable, Callable, Callable, Any]] = {
    "sum": (lambda x: x, _sum, lambda y: y, 0.0),
    "prod": (lambda x: x, _prod, lambda y: y, 1.0),
    "sumsq": (lambda x: x * x, _sum, lambda y: y, 0.0),
    "l1": (lambda x: torch.abs(x), _sum, lambda y: y, 0.0),
    "l2": (lambda x: _as_float(x) * _as_float(x), _sum, torch.sqrt, 0.0),
    "logsum": (_as_float, _sum, torch.log, float("-inf")),
    "mean": (_as_float, lambda x, d, k: torch.mean(x, d, k), lambda y: y, float("nan")),
    "max": (lambda x: x, lambda x, d, k: torch.amax(x, d, k), lambda y: y, _lowest),
    "min": (lambda x: x, lambda x, d, k: torch.amin(x, d, k), lambda y: y, _highest),
    "logsumexp": (_as_float, lambda x, d, k: torch.logsumexp(x, d, k), lambda y: y, float("-inf")),
}


def reduce(x: torch.Tensor, axes: Any, keepdims: int, noop: int, kind: str) -> torch.Tensor:
    pre, red, post, empty = _KINDS[kind]
    dims = _dims(x, axes, noop)
    if x.dtype == torch.bool and kind in ("max", "min"):
        return reduce(x.to(torch.uint8), axes, keepdims, noop, kind).to(torch.bool)
    if not dims:                            # noop_with_empty_axes, or a scalar
        return post(pre(x)).to(x.dtype)
    if any(x.shape[d] == 0 for d in dims):
        value = empty(x.dtype) if callable(empty) else empty
        return _empty_fill(x, dims, keepdims, value)
    return post(red(pre(x), dims, bool(keepdims))).to(x.dtype)


def _make_reduce(name: str, kind: str, axes_input_since: int, versions: tuple[int, ...]) -> None:
    @uint_safe
    def with_attr(x, *, axes=None, keepdims=1):  # noqa: ANN001
        return reduce(x, axes, keepdims, 0, kind)

    @uint_safe
    def with_input(x, axes=None, *, keepdims=1, noop_with_empty_axes=0):  # noqa: ANN001
        return reduce(x, axes, keepdims, noop_with_empty_axes, kind)

    for fn in (with_attr, with_input):
        fn.__name__ = f"{name.lower()}_{fn.__name__}"
        fn.__doc__ = f"ONNX {name}."
    for v in versions:
        fn = with_input if v >= axes_input_since else with_attr
        register(name, since=v, traits=RED, shape=reduce_shape,
                 host_inputs=(1,) if v >= axes_input_since else ())(fn)


for _name, _kind, _since, _versions in [
    ("ReduceSum", "sum", 13, (1, 11, 13)),
    ("ReduceMean", "mean", 18, (1, 11, 13, 18)),
    ("ReduceMax", "max", 18, (1, 11, 12, 13, 18, 20)),
    ("ReduceMin", "min", 18, (1, 11, 12, 13, 18, 20)),
    ("ReduceProd", "prod", 18, (1, 11, 13, 18)),
    ("ReduceL1", "l1", 18, (1, 11, 13, 18)),
    ("ReduceL2", "l2", 18, (1, 11, 13, 18)),
    ("ReduceLogSum", "logsum", 18, (1, 11, 13, 18)),
    ("ReduceLogSumExp", "logsumexp", 18, (1, 11, 13, 18)),
    ("ReduceSumSquare", "sumsq", 18, (1, 11, 13, 18)),
]:
    _make_reduce(_name, _kind, _since, _versions)


# ------------------------------------------------------------------------------- ArgMax/ArgMin

def _arg(x: torch.Tensor, axis: int, keepdims: int, select_last_index: int, largest: bool) -> torch.Tensor:
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    x = widen(x)
    a = norm_axis(axis, x.dim(), "ArgMax/ArgMin axis")
    f = torch.argmax if largest else torch.argmin
    if x.dim() == 0:
        return torch.zeros((), dtype=torch.int64, device=x.device)
    if select_last_index:
        n = x.shape[a]
        idx = (n - 1) - f(torch.flip(x, (a,)), dim=a, keepdim=bool(keepdims))
    elif x.is_cuda and a == x.dim() - 1 and x.shape[-1] >= TRITON_MIN and x.dtype.is_floating_point \
            and x.dtype != torch.float64 and _argmax_kernels() is not None:       # two small Triton kernels
        idx = _argmax_kernels().argmax(x.reshape(-1, x.shape[-1]), largest).reshape(x.shape[:-1])
        idx = idx.unsqueeze(-1) if keepdims else idx
    elif x.is_cuda and a == x.dim() - 1 and _two_stage_block(x) and x.is_contiguous():
        idx = arg_two_stage(x, bool(keepdims), largest)
    else:
        idx = f(x, dim=a, keepdim=bool(keepdims))
    return idx.to(torch.int64)


#: ArgMax/ArgMin over a last axis at least this long runs in two stages on CUDA (e.g. over a 128,256-entry
#: vocabulary: torch's single reduction over one row runs on one block, ~36 us on the H200): the two
#: Triton kernels of kernels/argmax.py from ``TRITON_MIN`` entries, or (no Triton) torch's kernels in
#: ``arg_two_stage`` from ``TWO_STAGE_MIN`` (its blocks must divide the row). ``TRITON_MIN`` takes in
#: 32,000-entry vocabularies (Llama-2, llama-125m), whose one-block torch reduction took 10.7 us of a
#: 314 us llama-125m decode step on the H200 (sixteenth session's profile)
TWO_STAGE_MIN = 32768
TRITON_MIN = 16384
_argmax_state: list = []


def _argmax_kernels():
    from shapeplan.ops._common import triton_kernels
    return triton_kernels(_argmax_state, "argmax", "ArgMax/ArgMin")


def _two_stage_block(x: torch.Tensor) -> int:
    """The block length of a two-stage reduction over ``x``'s last axis (0: use one stage)."""
    n = x.shape[-1] if x.dim() else 0
    if n < TWO_STAGE_MIN or not x.dtype.is_floating_point:
        return 0
    return next((b for b in (1024, 512, 256, 128) if n % b == 0), 0)


def arg_two_stage(x: torch.Tensor, keepdim: bool, largest: bool = True) -> torch.Tensor:
    """argmax/argmin over the last axis in two stages: the extreme and its index within each block of
    ``_two_stage_block(x)`` entries (one parallel reduction), then the first block holding the overall
    extreme. Same answer as ``torch.argmax``/``argmin``: the first index of the extreme (ties), and the
    first NaN when there is one (both stages propagate NaN and keep the first index on ties)."""
    n = x.shape[-1]
    blk = _two_stage_block(x)
    blocks = x.reshape(*x.shape[:-1], n // blk, blk)
    val, idx = blocks.max(-1) if largest else blocks.min(-1)                # [..., n/blk]
    j = (val.argmax if largest else val.argmin)(-1, keepdim=True)           # [..., 1]
    out = idx.gather(-1, j) + j * blk
    return out if keepdim else out.squeeze(-1)


def _make_arg(name: str, largest: bool) -> None:
    def v1(x, *, axis=0, keepdims=1):  # noqa: ANN001
        return _arg(x, axis, keepdims, 0, largest)

    def v12(x, *, axis=0, keepdims=1, select_last_index=0):  # noqa: ANN001
        return _arg(x, axis, keepdims, select_last_index, largest)

    v1.__doc__ = v12.__doc__ = f"ONNX {name}: int64 indices, first of ties unless select_last_index."
    register(name, since=1, traits=RED, shape=_arg_shape)(v1)
    register(name, since=12, traits=RED, shape=_arg_shape)(v12)


_make_arg("ArgMax", True)
_make_arg("ArgMin", False)


# ------------------------------------------------------------------------------ CumSum/CumProd

def _cumulative(x: torch.Tensor, axis: Any, exclusive: int, reverse: int, prod: bool) -> torch.Tensor:
    a = norm_axis(int(axis.reshape(-1)[0]) if isinstance(axis, torch.Tensor) else int(axis), x.dim(),
                  "CumSum/CumProd axis")
    dt = x.dtype
    y = x.float() if dt in (torch.float16, torch.bfloat16) else x
    if reverse:
        y = torch.flip(y, (a,))
    if exclusive:
        pad_shape = list(y.shape)
        pad_shape[a] = 1
        ident = torch.full(pad_shape, 1 if prod else 0, dtype=y.dtype, device=y.device)
        y = torch.cat([ident, y.narrow(a, 0, max(y.shape[a] - 1, 0))], dim=a)
    y = torch.cumprod(y, a, dtype=y.dtype) if prod else torch.cumsum(y, a, dtype=y.dtype)
    if reverse:
        y = torch.flip(y, (a,))
    return y.to(dt)


def _same_shape(node: Any) -> list:
    return [(node.inputs[0].dtype, node.inputs[0].shape)]


@register("CumSum", since=11, traits=Trait.NONE, shape=_same_shape, host_inputs=(1,))
@uint_safe
def cumsum(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumSum along ``axis`` (a scalar input), optionally exclusive and/or reversed."""
    return _cumulative(x, axis, exclusive, reverse, prod=False)


@register("CumProd", since=26, traits=Trait.NONE, shape=_same_shape, host_inputs=(1,))
@uint_safe
def cumprod(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumProd along ``axis``, optionally exclusive and/or reversed."""
    return _cumulative(x, axis, exclusive, reverse, prod=True)

