"""Peephole: involutions and idempotent pairs of unary ops.

    before:  relu(relu(x)); neg(neg(x)); abs(abs(x)); log(exp(x)); exp(log(x))
    after:   relu(x);       x;           abs(x);      x;           x (fast-math only)

``log(exp(x)) -> x`` differs only where exp overflows (x > ~88 in float32: inf vs x) and is applied
by default; ``exp(log(x)) -> x`` is wrong for x <= 0 (NaN / 0 vs x), so it applies only with
``SHAPEPLAN_OPTIMIZER_FAST_MATH=1``. Only floating-point tensors are touched by log/exp rules.
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph
from shapeplan.optimize.algebraic import _fast_math
from shapeplan.optimize.rewrite import Match, P, apply_rules, is_float


def inner(m: Match):  # noqa: ANN201
    return m["inner"].outputs[0]


def cancel(m: Match):  # noqa: ANN201
    return m.keep_shape("x")


def log_exp(m: Match):  # noqa: ANN201
    return m.keep_shape("x") if is_float(m.out) else None


def exp_log(m: Match):  # noqa: ANN201
    return m.keep_shape("x") if is_float(m.out) and _fast_math() else None


RULES = [
    (P("Relu", P("Relu", "x", name="inner", shared=True)), inner),
    (P("Abs", P("Abs", "x", name="inner", shared=True)), inner),
    (P("Abs", P("Relu", "x", name="inner", shared=True)), inner),
    (P("Relu", P("Abs", "x", name="inner", shared=True)), inner),
    (P("Neg", P("Neg", "x", shared=True)), cancel),
    (P("Log", P("Exp", "x", shared=True)), log_exp),
    (P("Exp", P("Log", "x", shared=True)), exp_log),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "Peephole")
