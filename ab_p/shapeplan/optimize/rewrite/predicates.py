"""Small predicates and parameter readers the passes share (dtypes, constants, shapes, axes)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from shapeplan.ir.dtypes import DType
from shapeplan.ir.graph import Node, Value

if TYPE_CHECKING:
    from shapeplan.optimize.rewrite.rewriter import Rewriter


def is_float(v: Value | None) -> bool:
    return v is not None and v.dtype is not None and v.dtype.is_float


def is_int(v: Value | None) -> bool:
    return (v is not None and v.dtype is not None and v.dtype.torch is not None
            and not v.dtype.torch.is_floating_point and not v.dtype.torch.is_complex
            and v.dtype.name != "bool")


def all_equal(t: torch.Tensor, x: float) -> bool:
    if t.numel() == 0:
        return False
    if t.dtype == torch.bool:
        return bool((t == bool(x)).all())
    return bool((t == x).all())


def close_to(t: torch.Tensor, x: float, rel: float = 1e-3) -> bool:
    return t.numel() == 1 and math.isclose(float(t.reshape(()).item()), x, rel_tol=rel)


def dtype_of(v: Value | None) -> DType | None:
    return None if v is None else v.dtype


def static_shape(v: Value | None) -> tuple[int, ...] | None:
    return tuple(v.shape) if v is not None and v.is_static else None  # type: ignore[arg-type]


def norm_axis(axis: int, rank: int | None) -> int | None:
    if axis >= 0:
        return axis
    return None if rank is None else axis + rank


def int_list(rw: Rewriter, node: Node, attr: str, input_index: int) -> list[int] | None:
    """An int-list parameter given as attribute (old opsets) or constant input (new opsets).

    Returns None when it is not known at compile time; [] when absent."""
    if attr in node.attrs:
        v = node.attrs[attr]
        return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    if len(node.inputs) > input_index and node.inputs[input_index] is not None:
        t = rw.const_value(node.inputs[input_index])
        if t is None:
            return None
        return [int(x) for x in t.reshape(-1).tolist()]
    return []


def shapes_equal(a: Any, b: Any) -> bool:
    """Static or symbolic shapes that are provably equal (no unknown dims)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and y is not None and x == y for x, y in zip(a, b))
