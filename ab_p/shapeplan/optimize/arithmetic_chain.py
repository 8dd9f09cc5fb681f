"""ArithmeticChainFolding: fold constants through chains of adds and multiplies.

    before:  y = Add(Add(x, c1), c2);  z = Mul(Mul(x, c1), c2);  w = Add(Mul(x, c1), Mul(x, c2))
    after:   y = Add(x, c1+c2);        z = Mul(x, c1*c2);        w = Mul(x, c1+c2)

``Sub(x, c)`` chains are handled as ``Add(x, -c)``. The intermediate must have no other reader.
For floats the result may differ from the original in the last bit (reassociation); integer
chains are exact (wrap-around is associative). Applied when the folded constant's broadcast keeps
the output shape.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import C, Match, P, apply_rules


def _ok(m: Match, c: torch.Tensor) -> bool:
    x = m["x"]
    return x.dtype is not None and x.dtype.torch == c.dtype and c.numel() <= 1 << 16


def add_add(m: Match):  # noqa: ANN201
    c = m["c1"] + m["c2"]
    return m.op("Add", m["x"], m.const(c), like=m.out) if _ok(m, c) else None


def add_sub(m: Match):  # noqa: ANN201   (x + c1) - c2
    c = m["c1"] - m["c2"]
    return m.op("Add", m["x"], m.const(c), like=m.out) if _ok(m, c) else None


def sub_add(m: Match):  # noqa: ANN201   (x - c1) + c2
    c = m["c2"] - m["c1"]
    return m.op("Add", m["x"], m.const(c), like=m.out) if _ok(m, c) else None


def sub_sub(m: Match):  # noqa: ANN201   (x - c1) - c2
    c = m["c1"] + m["c2"]
    return m.op("Sub", m["x"], m.const(c), like=m.out) if _ok(m, c) else None


def mul_mul(m: Match):  # noqa: ANN201
    c = m["c1"] * m["c2"]
    return m.op("Mul", m["x"], m.const(c), like=m.out) if _ok(m, c) else None


def distribute(m: Match):  # noqa: ANN201   x*c1 + x*c2
    c = m["c1"] + m["c2"]
    return m.op("Mul", m["x"], m.const(c), like=m.out) if _ok(m, c) else None


RULES = [
    (P("Add", P("Add", "x", C("c1")), C("c2")), add_add),
    (P("Sub", P("Add", "x", C("c1")), C("c2")), add_sub),
    (P("Add", P("Sub", "x", C("c1")), C("c2")), sub_add),
    (P("Sub", P("Sub", "x", C("c1")), C("c2")), sub_sub),
    (P("Mul", P("Mul", "x", C("c1")), C("c2")), mul_mul),
    (P("Add", P("Mul", "x", C("c1")), P("Mul", "x", C("c2"))), distribute),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "ArithmeticChainFolding")
