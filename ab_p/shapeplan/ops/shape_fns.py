"""Reusable shape functions. A shape function takes the Node (inputs carry dtype/shape) and returns
a list of (dtype, shape) per output; ``None`` means unknown. Dims may be symbolic strings."""
from __future__ import annotations

from typing import Any, Callable

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import DType, dtype as as_dtype
from shapeplan.ir.graph import Dim, Shape

ShapeFn = Callable[[Any], list[tuple[DType | None, Shape | None]]]


def broadcast_shapes(*shapes: Shape | None, where: str = "") -> Shape | None:
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)  # type: ignore[arg-type]
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]  # type: ignore[arg-type]
        ints = {d for d in dims if isinstance(d, int) and d != 1}
        syms = [d for d in dims if not isinstance(d, int) and d is not None]
        if len(ints) > 1:
            raise ShapeError(f"{where}cannot broadcast shapes {list(map(list, shapes))}: "   # type: ignore
                             f"dimension {i} has sizes {sorted(ints)}")
        if ints:
            out.append(ints.pop())
        elif syms:
            out.append(syms[0] if all(s == syms[0] for s in syms) else None)
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def same_as(i: int = 0, dtype: Any = None) -> ShapeFn:
    def fn(node: Any) -> list[tuple[DType | None, Shape | None]]:
        v = node.inputs[i]
        return [(as_dtype(dtype) if dtype else v.dtype, v.shape)] * len(node.outputs)
    return fn


def broadcast(dtype: Any = None, dtype_from: int = 0) -> ShapeFn:
    def fn(node: Any) -> list[tuple[DType | None, Shape | None]]:
        shapes = [v.shape for v in node.inputs if v is not None]
        out = broadcast_shapes(*shapes, where=f"node {node.describe()}: ")
        dt = as_dtype(dtype) if dtype else node.inputs[dtype_from].dtype
        return [(dt, out)]
    return fn


def matmul_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    a, b = node.inputs[0], node.inputs[1]
    if a.shape is None or b.shape is None:
        return [(a.dtype, None)]
    sa, sb = list(a.shape), list(b.shape)
    if len(sa) == 1:
        sa = [1] + sa
    if len(sb) == 1:
        sb = sb + [1]
    k1, k2 = sa[-1], sb[-2]
    if isinstance(k1, int) and isinstance(k2, int) and k1 != k2:
        raise ShapeError(f"node {node.describe()}: MatMul inner dimensions differ: "
                         f"{list(a.shape)} @ {list(b.shape)} ({k1} vs {k2})")
    batch = broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]), where=f"node {node.describe()}: ")
    out = list(batch or ()) + [sa[-2], sb[-1]]
    if len(a.shape) == 1:
        out.pop(-2)
    if len(b.shape) == 1:
        out.pop(-1)
    return [(a.dtype, tuple(out))]
