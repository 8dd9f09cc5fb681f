"""ConstantConditionWhere: a Where whose condition is a known constant picks a branch.

    before:  y = Where(const all-True, a, b);   z = Where(c, x, x)
    after:   y -> a;                            z -> x

Applied only when the chosen branch already has the output's dtype and static shape (otherwise
the Where also broadcasts, and removing it would change the shape).
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import C, Match, P, apply_rules


def where_true(m: Match):  # noqa: ANN201
    return m.keep_shape("a") if bool(m["c"].all()) else None


def where_false(m: Match):  # noqa: ANN201
    return m.keep_shape("b") if not bool(m["c"].any()) else None


def where_same(m: Match):  # noqa: ANN201
    return m.keep_shape("x")


RULES = [
    (P("Where", C("c", lambda t: bool(t.all())), "a", "b"), where_true),
    (P("Where", C("c", lambda t: not bool(t.any())), "a", "b"), where_false),
    (P("Where", "c", "x", "x"), where_same),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "ConstantConditionWhere")
