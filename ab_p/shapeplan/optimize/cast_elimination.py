"""CastElimination: casts to the value's own dtype vanish; lossless cast chains collapse.

    before:  a = Cast(x:f32, to=f32); b = Cast(Cast(x:f16, to=f32), to=f64); c = Cast(Cast(x:f32, to=f64), to=f32)
    after:   a -> x;                  b = Cast(x, to=f64);                   c -> x

A chain ``Cast(Cast(x, A), B)`` is shortened only when the first cast is lossless for x's dtype
(every value of x survives the trip to A), so the result is bit-identical. ``f32 -> f16 -> f32``
(rounding) and ``f32 -> i32 -> f32`` (truncation) are left alone.
"""
from __future__ import annotations

from shapeplan.ir.dtypes import DType, dtype as as_dtype
from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import Match, P, apply_rules

# dtype -> dtypes that hold every one of its values exactly
_WIDER: dict[str, set[str]] = {
    "bool": {"uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
             "bfloat16", "float32", "float64"},
    "int8": {"int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "uint8": {"int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16", "float32", "float64"},
    "int16": {"int32", "int64", "float32", "float64"},
    "uint16": {"int32", "int64", "uint32", "uint64", "float32", "float64"},
    "int32": {"int64", "float64"},
    "uint32": {"int64", "uint64", "float64"},
    "float16": {"float32", "float64"},
    "bfloat16": {"float32", "float64"},
    "float32": {"float64"},
}


def _to(node_attrs: dict) -> DType | None:
    try:
        return as_dtype(int(node_attrs["to"]))
    except Exception:  # noqa: BLE001
        return None


def lossless(src: DType, dst: DType) -> bool:
    return src == dst or dst.name in _WIDER.get(src.name, ())


def cast_to_same(m: Match):  # noqa: ANN201
    x = m["x"]
    to = _to(m.root.attrs)
    return x if to is not None and x.dtype == to else None


def cast_chain(m: Match):  # noqa: ANN201
    x, inner = m["x"], m["inner"]
    a, b = _to(inner.attrs), _to(m.root.attrs)
    if x.dtype is None or a is None or b is None or not lossless(x.dtype, a):
        return None
    if x.dtype == b:
        return x
    return m.op("Cast", x, to=b.onnx, like=m.out)


RULES = [
    (P("Cast", "x"), cast_to_same),
    (P("Cast", P("Cast", "x", name="inner")), cast_chain),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "CastElimination")
