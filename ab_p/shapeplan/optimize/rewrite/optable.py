"""Memoized op-table queries for the rewriter: OpDef and trait bits per (op, domain, opset)."""
from __future__ import annotations

from shapeplan.ir.graph import Graph, Node
from shapeplan.ops.registry import OpDef, Trait, lookup

#: nodes that must never be removed even when their outputs are unused
KEEP_TRAITS = Trait.MUTATES_INPUT
COMMUTATIVE = Trait.COMMUTATIVE.value
MUTATES = Trait.MUTATES_INPUT.value
KEEP = KEEP_TRAITS.value
CONTROL_FLOW = Trait.CONTROL_FLOW.value

#: (op, domain, opset) -> OpDef | None; misses are cached too (a failed lookup builds a costly hint)
_OPDEFS: dict[tuple[str, str, int], OpDef | None] = {}
#: (op, domain, opset) -> trait bits as a plain int
TRAITS: dict[tuple[str, str, int], int] = {}


def cached_lookup(op_type: str, domain: str, opset: int) -> OpDef | None:
    key = (op_type, domain, opset)
    try:
        return _OPDEFS[key]
    except KeyError:
        pass
    try:
        od: OpDef | None = lookup(op_type, domain, opset)
    except Exception:  # noqa: BLE001
        od = None
    _OPDEFS[key] = od
    return od


def clear() -> None:
    """Forget every cached lookup (the op table may have grown since the last optimize())."""
    _OPDEFS.clear()
    TRAITS.clear()


def subgraphs_mutate(n: Node, g: Graph) -> bool:
    """A MUTATES_INPUT node (or an op the table lacks) inside ``n``'s subgraphs, at any depth."""
    for sub in n.subgraphs():
        for m in sub.nodes:
            od = cached_lookup(m.op_type, m.domain, sub.opset(m.domain))
            if od is None or od.has(Trait.MUTATES_INPUT):
                return True
            if m.subgraphs() and subgraphs_mutate(m, sub):
                return True
    return False
