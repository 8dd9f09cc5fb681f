"""ConstantFolding: evaluate nodes whose inputs are all constants, at compile time.

    before:  c = Add(const[2,2], const[2,2]); y = Mul(x, c)
    after:   y = Mul(x, const_c[2,2])          # c became a CONSTANT value (same name)

Not folded: RANDOM, MUTATES_INPUT, CONTROL_FLOW, SEQUENCE and HOST_SYNC-free-but-dynamic ops whose
kernel fails, ops producing non-tensors, and results much larger than their inputs
(``out_elems > max(2**16, 2 * in_elems)``: folding an Expand to a huge constant costs memory).
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.graph import Graph, Node, ValueKind
from shapeplan.ops.registry import Trait, bind_kernel
from shapeplan.optimize.rewrite import Rewriter

_NO_FOLD = Trait.RANDOM | Trait.MUTATES_INPUT | Trait.CONTROL_FLOW | Trait.SEQUENCE
_MIN_LIMIT = 1 << 16


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "ConstantFolding")
    count = 0
    for node in graph.nodes:
        if _fold(rw, node):
            count += 1
    rw.commit()
    return count


def evaluate(rw: Rewriter, node: Node, inputs: list) -> Any:
    """The node's op-table kernel run on these input tensors at compile time (its outputs), or None when
    the op has no kernel or it cannot run here."""
    opdef = rw.opdef(node)
    if opdef is None:
        return None
    try:
        return bind_kernel(opdef, node, rw.g.opset(node.domain))(*inputs)
    except Exception:  # noqa: BLE001 - a kernel that cannot run here is simply not folded
        return None


def _fold(rw: Rewriter, node: Node) -> bool:
    constant = ValueKind.CONSTANT
    for v in node.inputs:                # cheapest test first: most nodes read a computed value
        if v is not None and (v.kind is not constant or not isinstance(v.data, torch.Tensor)):
            return False
    if node.implicit_inputs or (node.attrs and node.subgraphs()):
        return False
    ins = [v for v in node.inputs if v is not None]
    opdef = rw.opdef(node)
    if opdef is None or opdef.has(_NO_FOLD):
        return False
    if not ins and node.op_type != "Constant" and not opdef.has(Trait.CREATES_VALUE):
        return False
    if any(o.name and rw.pinned(o) and id(o) not in rw.output_ids for o in node.outputs):
        return False                        # a subgraph reads it by name; leave it computed
    in_elems = sum(v.data.numel() for v in ins)
    outs = evaluate(rw, node, [None if v is None else v.data for v in node.inputs])
    if outs is None:
        return False
    if len(outs) < len([o for o in node.outputs if o.name]):
        return False
    for o in outs:
        if not isinstance(o, torch.Tensor) or o.numel() > max(_MIN_LIMIT, 2 * in_elems):
            return False
    for o, t in zip(node.outputs, outs):
        if not o.name:
            continue
        t = t.detach().contiguous()
        if o.dtype is not None and o.dtype.torch is not None and t.dtype != o.dtype.torch:
            t = t.to(o.dtype.torch)
        o.kind = ValueKind.CONSTANT
        o.data = t
        o.dtype = as_dtype(t.dtype)
        o.shape = tuple(t.shape)
        o.producer = None
    rw.dead.add(node)
    rw.removed += 1
    for v in ins:
        lst = rw.users.get(v)
        if lst and node in lst:
            lst.remove(node)
    rw.emit(f"folded {node.describe()}", node=node.name, op=node.op_type)
    rw.changed += 1
    return True
