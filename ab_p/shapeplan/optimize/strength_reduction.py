"""StrengthReduction: cheaper ops for the same value.

    before:  pow(x, 2); pow(x, 1); pow(x, -1);      div(x, 4.0);     div(x, 3.0)
    after:   x * x;     x;         reciprocal(x);   x * 0.25;        x * 0.3333333

Floating point only (integer Pow/Div keep their integer semantics). Division by a constant
becomes multiplication by its reciprocal: exact for powers of two, otherwise within 1 ulp;
a constant containing 0 is left alone.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import C, Match, P, all_equal, apply_rules, is_float


def _scalar(x: float):  # noqa: ANN202
    return lambda t: t.numel() == 1 and all_equal(t, x)


def square(m: Match):  # noqa: ANN201
    return m.op("Mul", m["x"], m["x"], like=m.out) if is_float(m.out) and m.keep_shape("x") else None


def pow_one(m: Match):  # noqa: ANN201
    return m.keep_shape("x") if is_float(m.out) else None


def pow_minus_one(m: Match):  # noqa: ANN201
    return m.op("Reciprocal", m["x"], like=m.out) if is_float(m.out) and m.keep_shape("x") else None


def div_const(m: Match):  # noqa: ANN201
    c = m["c"]
    x = m["x"]
    if not is_float(m.out) or not c.dtype.is_floating_point or bool((c == 0).any()) or x.dtype is None:
        return None
    if x.dtype.torch != c.dtype or c.numel() > 1 << 16:
        return None
    return m.op("Mul", x, m.const(torch.reciprocal(c)), like=m.out)


RULES = [
    (P("Pow", "x", C("e", _scalar(2))), square),
    (P("Pow", "x", C("e", _scalar(1))), pow_one),
    (P("Pow", "x", C("e", _scalar(-1))), pow_minus_one),
    (P("Div", "x", C("c")), div_const),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "StrengthReduction")
