"""ReshapeChainFolding: a Reshape of a shape-only op reshapes the original directly.

    before:  y = Reshape(Reshape(x, [6, 4]), [2, 12]);  z = Reshape(Unsqueeze(x, [0]), [-1])
    after:   y = Reshape(x, [2, 12]);                   z = Reshape(x, [-1])

The inner op (Reshape, Flatten, Squeeze, Unsqueeze) only relabels dims, so the outer target
shape decides. Not applied when the outer shape contains 0 without ``allowzero=1`` (0 copies a dim
of the *inner* result) unless that dim is statically known.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph
from shapeplan.optimize.rewrite import C, Match, P, apply_rules

_SHAPE_ONLY = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def reshape_chain(m: Match):  # noqa: ANN201
    shape = m["shape"]
    inner_out = m["inner"].outputs[0]
    zeros = (shape == 0).nonzero().reshape(-1).tolist()
    if zeros and not int(m.root.attrs.get("allowzero", 0)):
        if inner_out.shape is None or any(i >= len(inner_out.shape) or not isinstance(inner_out.shape[i], int)
                                          for i in zeros):
            return None
        shape = shape.clone()
        for i in zeros:
            shape[i] = int(inner_out.shape[i])
        return m.op("Reshape", m["x"], m.const(shape.to(torch.int64)), like=m.out)
    if m["x"].dtype != m.out.dtype and m.out.dtype is not None:
        return None
    return m.op("Reshape", m["x"], m["shape_value"], like=m.out, **dict(m.root.attrs))


RULES = [(P("Reshape", P(_SHAPE_ONLY, "x", name="inner"), C("shape")), reshape_chain),
         (P("Reshape", P(_SHAPE_ONLY, "x", "s_in", name="inner"), C("shape")), reshape_chain)]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "ReshapeChainFolding")
