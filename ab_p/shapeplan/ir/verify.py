"""Check the IR at the edges: every read value is defined before use, ops exist, names are unique."""
from __future__ import annotations

from shapeplan.errors import ModelError, UnsupportedOpError
from shapeplan.ir.graph import Graph, ValueKind
from shapeplan.ops.registry import lookup


def verify(graph: Graph, *, check_ops: bool = True) -> None:
    """Raise ModelError naming the offending node when the graph is not well formed."""
    defined: set[int] = set()
    for v in graph.values.values():
        if v.kind is not ValueKind.INTERMEDIATE:
            defined.add(id(v))
    names: dict[str, object] = {}
    for node in graph.nodes:
        if check_ops:
            try:
                lookup(node.op_type, node.domain, graph.opset(node.domain))
            except UnsupportedOpError as e:
                raise UnsupportedOpError(f"node {node.describe()}: {e}") from None
        for v in node.all_inputs:
            if v is not None and id(v) not in defined:
                where = "later in the graph" if v.producer in graph.nodes else "nowhere in this graph"
                raise ModelError(f"node {node.describe()} reads %{v.name}, which is defined {where} "
                                 f"(graph {graph.name!r}; graph not in topological order or dangling value)")
        for o in node.outputs:
            if not o.name:
                continue
            if o.name in names:
                raise ModelError(f"node {node.describe()} redefines %{o.name}")
            names[o.name] = node
            if o.producer is not node:
                raise ModelError(f"node {node.describe()}: output %{o.name} has a stale producer link")
            defined.add(id(o))
        for sub in node.subgraphs():
            verify(sub, check_ops=check_ops)
    for v in graph.outputs:
        if id(v) not in defined:
            raise ModelError(f"graph {graph.name!r} output %{v.name} is never produced")
