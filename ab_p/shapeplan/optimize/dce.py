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
    users, dead = rw.users, rw.dead
    for node in reversed(graph.nodes):            # reverse order: a dead reader frees its producers
        if node in dead:
            continue
        live = False
        for o in node.outputs:
            lst = users.get(o)
            if (lst and (not dead or any(n not in dead for n in lst))) or (o.name and rw.pinned(o)):
                live = True
                break
        if not live and rw.removable(node):
            rw._kill(node)
    removed = rw.removed
    rw.commit()
    # constants no node reads (and no subgraph captures) only bloat the plan's register file
    outs = {id(v) for v in graph.outputs}
    for name, v in list(graph.values.items()):
        if v.kind is ValueKind.CONSTANT and not users.get(v) and id(v) not in outs \
                and name not in rw.captured_names:
            del graph.values[name]
            users.pop(v, None)
            removed += 1
    return removed
