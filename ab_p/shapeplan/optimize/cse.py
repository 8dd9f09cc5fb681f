"""CommonSubexpressionElimination: identical nodes on identical inputs compute once.

    before:  a = Relu(x); b = Relu(x); y = Add(a, b)
    after:   a = Relu(x);              y = Add(a, a)

Key: (domain, op, inputs (sorted for COMMUTATIVE ops), attributes, #outputs). Never merged:
RANDOM, MUTATES_INPUT, CONTROL_FLOW / subgraph nodes, and nodes that read a value some
MUTATES_INPUT node writes (the two reads may see different contents). Small equal constants
(<= 4096 elements, same dtype/shape/bytes) are merged first so nodes reading copies match.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.ir.graph import Graph, ValueKind
from shapeplan.ops.registry import Trait
from shapeplan.optimize.rewrite import Rewriter

_NEVER = (Trait.RANDOM | Trait.MUTATES_INPUT | Trait.CONTROL_FLOW).value   # plain ints: Flag ops are slow
_COMMUTATIVE = Trait.COMMUTATIVE.value


def _raw(t: torch.Tensor) -> bytes:
    """The tensor's bytes, whatever its device or dtype (bf16 and CUDA tensors included)."""
    t = t.detach()
    if t.device.type == "cpu":
        try:                          # the same bytes without the (slow) dtype view
            return t.contiguous().numpy().tobytes()
        except (TypeError, RuntimeError):   # bf16 / fp8 / conj views: numpy has no such dtype
            pass
    return t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _attr_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("T", str(v.dtype), tuple(v.shape), _raw(v))
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, float) and v != v:
        return ("nan",)
    try:
        hash(v)
        return v
    except TypeError:
        return ("id", id(v))


_KEYS: dict[int, tuple[torch.Tensor, tuple | None]] = {}


def _const_key(t: torch.Tensor) -> tuple | None:
    hit = _KEYS.get(id(t))
    if hit is not None and hit[0] is t:
        return hit[1]
    key = None
    if t.numel() <= 4096 and t.dtype.is_floating_point is not None:
        key = (str(t.dtype), tuple(t.shape), _raw(t))
    if len(_KEYS) > 200_000:
        _KEYS.clear()
    _KEYS[id(t)] = (t, key)            # holds t so its id is not reused while cached
    return key


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "CommonSubexpressionElimination")
    dup: dict[int, Any] = {}           # id(duplicate constant) -> the first equal constant
    seen_const: dict[tuple, Any] = {}
    constant = ValueKind.CONSTANT
    for v in graph.values.values():
        if v.kind is constant and isinstance(v.data, torch.Tensor) and not rw.pinned(v):
            k = _const_key(v.data)
            if k is not None:
                c = seen_const.setdefault(k, v)
                if c is not v:
                    dup[id(v)] = c
    count = 0
    # rewire readers of duplicate constants (none left after the first round: skip the scan)
    for n in graph.nodes if dup else ():
        if any(v is not None and id(v) in dup for v in n.inputs):
            for i, v in enumerate(n.inputs):
                if v is not None and id(v) in dup:
                    n.inputs[i] = dup[id(v)]
                    rw.users.setdefault(dup[id(v)], []).append(n)
            count += 1
    seen: dict[tuple, Any] = {}
    dead, mutated, variable = rw.dead, rw.mutated, ValueKind.VARIABLE
    for node in graph.nodes:
        if node in dead or node.implicit_inputs or (node.attrs and node.subgraphs()):
            continue
        traits = rw.traits(node)
        if traits & _NEVER or rw.opdef(node) is None:
            continue
        ins: list[int] = []
        for v in node.inputs:
            if v is None:
                ins.append(0)
            elif v.kind is variable or (mutated and id(v) in mutated):
                break                         # reads state a mutator writes: never merged
            else:
                ins.append(id(v))
        if len(ins) != len(node.inputs):      # stopped early at such a read
            continue
        if len(ins) == 2 and traits & _COMMUTATIVE:
            ins.sort()
        attrs = node.attrs
        key = (node.domain, node.op_type, tuple(ins), len(node.outputs),
               tuple(sorted((k, _attr_key(a)) for k, a in attrs.items())) if attrs else ())
        prev = seen.get(key)
        if prev is None or prev in rw.dead:
            seen[key] = node
            continue
        ok = True
        for o, p in zip(node.outputs, prev.outputs):
            if o.name and (rw.readers(o) or rw.pinned(o)):
                if not p.name or not rw.replace(o, p, before=node):
                    ok = False
        if ok:
            count += 1
            rw.emit(f"{node.describe()} == {prev.describe()}", node=node.name)
            rw.sweep(node)
    rw.commit()
    return count
