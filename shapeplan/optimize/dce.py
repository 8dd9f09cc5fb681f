"""DeadCodeElimination: drop nodes whose outputs nobody reads, and constants nobody reads.

    before:  a = Relu(x); b = Exp(x)   # b unused      return a
    after:   a = Relu(x)                               return a

Kept: graph outputs, values a subgraph reads (implicit inputs / captures), MUTATES_INPUT nodes
(side effects) and control flow whose bodies mutate state, placeholders and VARIABLE values.
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph, ValueKind
from shapeplan.optimize.rewrite import Rewriter


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "DeadCodeElimination")
    for node in reversed(graph.nodes):
        if node not in rw.dead:
            rw.sweep(node)
    removed = rw.removed
    rw.commit()
    # constants no node reads (and no subgraph captures) only bloat the plan's register file
    read = {id(v) for n in graph.nodes for v in n.all_inputs if v is not None}
    read.update(id(v) for v in graph.outputs)
    for name, v in list(graph.values.items()):
        if (v.kind is ValueKind.CONSTANT and id(v) not in read and name not in rw.captured_names):
            del graph.values[name]
            removed += 1
    return removed
