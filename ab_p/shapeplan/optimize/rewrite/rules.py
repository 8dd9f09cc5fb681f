"""Running a (pattern, replacement) table over a graph: one pass of local rewrites as data."""
from __future__ import annotations

from typing import Callable

from shapeplan.ir.graph import Graph, Node
from shapeplan.optimize.rewrite.optable import COMMUTATIVE
from shapeplan.optimize.rewrite.patterns import C, Match, P, Rule, match_node, quick_checks
from shapeplan.optimize.rewrite.rewriter import Rewriter


def apply_rules(graph: Graph, rules: list[Rule], pass_name: str) -> int:
    """Run a (pattern, replacement) table once over the graph in order; returns #rewrites."""
    by_op: dict[str, list[tuple]] = {}
    for pat, fn in rules:
        checks = tuple((i, p) for i, p in enumerate(pat.inputs) if type(p) is P or type(p) is C)
        for op in pat.ops():
            by_op.setdefault(op, []).append((pat, fn, len(pat.inputs), checks))
    rw = Rewriter.get(graph, pass_name)
    count = 0
    dead, traits = rw.dead, rw.traits
    for node in list(graph.nodes):
        cands = by_op.get(node.op_type)
        if not cands or node in dead or not node.outputs:
            continue
        # Rewriter.match() inlined (this loop sees every node of every rule pass): the structural
        # pre-check per candidate rule, then the full match
        ins = node.inputs
        n = len(ins)
        while n and ins[n - 1] is None:
            n -= 1
        swapped = (ins[1], ins[0]) if n == 2 and traits(node) & COMMUTATIVE else None
        for pat, fn, npins, checks in cands:
            if npins and (n != npins or not (quick_checks(checks, ins) or
                                             (swapped is not None and quick_checks(checks, swapped)))):
                continue
            m = Match(rw, node)
            if not match_node(rw, pat, node, m):
                continue
            if rw.crosses_mutation(m.nodes, node):
                continue
            new = fn(m)
            if new is None:
                continue
            if rw.replace(node.outputs[0], new, before=node):
                count += 1
                rw.emit(f"{getattr(fn, '__name__', 'rule')} at {node.describe()}", node=node.name,
                        op=node.op_type)
                break
    rw.commit()
    return count


def rewrite_ops(graph: Graph, pass_name: str, handlers: dict[str, Callable[[Rewriter, Node], int]]) -> int:
    """Run ``handlers[op_type](rw, node)`` on every live ai.onnx node whose op has a handler, in graph
    order; returns the sum of what the handlers return (#rewrites) and commits. The driver of the
    passes whose matching is code rather than a (pattern, replacement) table."""
    rw = Rewriter.get(graph, pass_name)
    count = 0
    for node in list(graph.nodes):
        fn = handlers.get(node.op_type)
        if fn is not None and node.domain in ("", "ai.onnx") and node not in rw.dead:
            count += fn(rw, node)
    rw.commit()
    return count
