"""RedundancyElimination: repeated idempotent ops, self-binary ops, undone unsqueezes.

    before:  floor(floor(x)); max(x, x); and(b, b); not(not(b)); squeeze(unsqueeze(x, [1]), [1])
    after:   floor(x);        x;         b;         b;           x

Idempotent unary: Floor, Ceil, Round, Sign, (Relu/Abs are in Peephole). Self-binary: Max, Min,
And, Or (``f(x, x) = x``, applied when x has the output's static shape).
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import Match, P, apply_rules, int_list


def inner(m: Match):  # noqa: ANN201
    return m["inner"].outputs[0]


def keep_x(m: Match):  # noqa: ANN201
    return m.keep_shape("x")


def squeeze_unsqueeze(m: Match):  # noqa: ANN201
    a = int_list(m.rw, m["inner"], "axes", 1)
    b = int_list(m.rw, m.root, "axes", 1)
    x = m["x"]
    if not a or not b or x.rank is None:
        return None
    r = x.rank + len(a)
    na = sorted(i + r if i < 0 else i for i in a)
    nb = sorted(i + r if i < 0 else i for i in b)
    return x if na == nb else None


_IDEMPOTENT = ("Floor", "Ceil", "Round", "Sign")
RULES = [(P(op, P(op, "x", name="inner", shared=True)), inner) for op in _IDEMPOTENT] + [
    (P(op, "x", "x"), keep_x) for op in ("Max", "Min", "And", "Or")] + [
    (P("Not", P("Not", "x", shared=True)), keep_x),
    (P("Squeeze", P("Unsqueeze", "x", name="inner")), squeeze_unsqueeze),
    (P("Squeeze", P("Unsqueeze", "x", "ia", name="inner"), "sa"), squeeze_unsqueeze),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "RedundancyElimination")
