"""AlgebraicIdentities: x+0, x-0, x*1, x/1, x*0, sqrt(x*x), pow(x, .5), log(1).

    before:  y = Add(x, 0); z = Mul(x, 1); w = Sqrt(Mul(x, x)); p = Pow(x, 0.5); k = Mul(i:int64, 0)
    after:   y -> x;        z -> x;        w = Abs(x);          p = Sqrt(x);     k = zeros like k

Safety:
* identities that return ``x`` apply only when x already has the result's dtype and static shape
  (``x:[1] + zeros[4]`` broadcasts, so it stays); ``x + 0.0`` maps -0.0 to +0.0, so dropping it
  may turn a +0.0 into -0.0 (equal under ==, documented).
* ``x * 0 -> 0`` applies to integer and bool tensors only by default: for floats NaN*0 and inf*0
  are NaN. Set ``SHAPEPLAN_OPTIMIZER_FAST_MATH=1`` to apply it to floats too.
* ``sqrt(x*x) -> abs(x)`` is exact except where x*x overflows (the result becomes finite);
  ``pow(x, 0.5) -> sqrt(x)`` is exact (pow(-0., .5) = +0. vs sqrt(-0.) = -0.: equal under ==).
"""
from __future__ import annotations

import torch

from shapeplan import env
from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import C, Match, P, all_equal, apply_rules, is_float, is_int


def _fast_math() -> bool:
    return env.get("SHAPEPLAN_OPTIMIZER_FAST_MATH")


def _zero(t: torch.Tensor) -> bool:
    return all_equal(t, 0)


def _one(t: torch.Tensor) -> bool:
    return all_equal(t, 1)


def keep_x(m: Match):  # noqa: ANN201
    return m.keep_shape("x")


def times_zero(m: Match):  # noqa: ANN201
    out = m.out
    if not out.is_static or out.dtype is None or out.dtype.torch is None:
        return None
    if not (is_int(out) or out.dtype.name == "bool" or (is_float(out) and _fast_math())):
        return None
    return m.const(torch.zeros(tuple(out.shape), dtype=out.dtype.torch))  # type: ignore[arg-type]


def sqrt_square(m: Match):  # noqa: ANN201
    return m.op("Abs", m["x"], like=m.out) if is_float(m.out) else None


def pow_half(m: Match):  # noqa: ANN201
    if not is_float(m.out) or m.keep_shape("x") is None:
        return None
    return m.op("Sqrt", m["x"], like=m.out)


def log_one(m: Match):  # noqa: ANN201
    t = m["c"]
    return m.const(torch.zeros_like(t, dtype=t.dtype))


RULES = [
    (P("Add", "x", C("c", _zero)), keep_x),
    (P("Sub", "x", C("c", _zero)), keep_x),
    (P("Mul", "x", C("c", _one)), keep_x),
    (P("Div", "x", C("c", _one)), keep_x),
    (P("Mul", "x", C("c", _zero)), times_zero),
    (P("Sqrt", P("Mul", "x", "x")), sqrt_square),
    (P("Sqrt", P("Pow", "x", C("two", lambda t: all_equal(t, 2) and t.numel() == 1))), sqrt_square),
    (P("Pow", "x", C("half", lambda t: t.numel() == 1 and all_equal(t, 0.5))), pow_half),
    (P("Log", C("c", _one)), log_one),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "AlgebraicIdentities")
