"""SliceOfConcat and GatherOfConstant: read a piece straight from where it came from.

    before:  y = Slice(Concat(a:[2,4], b:[3,4], axis=0), starts=[2], ends=[5], axes=[0])
    after:   y -> b

    before:  d = Gather(Concat(s0:[1], s1:[1], s2:[1]), 2, axis=0)       # shape arithmetic
    after:   d = Gather(s2, 0)            (or a constant when s2 is constant)

SliceOfConcat: a step-1 Slice on the Concat axis whose range lies inside one input slices that
input (or is that input when it covers it exactly). GatherOfConstant: a Gather with a constant
scalar/1-element index on a 1-D Concat picks the element from the owning piece; a Gather of a
constant by a constant index is left to ConstantFolding.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph, Node
from shapeplan.optimize.rewrite import rewrite_ops, Rewriter, int_list, norm_axis


def run_slice(graph: Graph) -> int:
    return rewrite_ops(graph, "SliceOfConcat", {"Slice": _slice_of_concat})


def run_gather(graph: Graph) -> int:
    return rewrite_ops(graph, "GatherOfConstant", {"Gather": _gather_of_concat})


def _pieces(rw: Rewriter, cat: Node, ax: int) -> list[tuple[int, int, object]] | None:
    out, off = [], 0
    for v in cat.inputs:
        if v is None:
            continue
        if v.shape is None or not isinstance(v.shape[ax], int):
            return None
        n = int(v.shape[ax])
        out.append((off, off + n, v))
        off += n
    return out


def _slice_of_concat(rw: Rewriter, node: Node) -> int:
    x, out = node.inputs[0], node.outputs[0]
    cat = rw.producer(x)
    if cat is None or cat.op_type != "Concat" or x is None or x.rank is None or x.shape is None:
        return 0
    if len(node.inputs) < 3:                         # opset < 10 attribute form: leave it
        return 0
    starts, ends = int_list(rw, node, "starts", 1), int_list(rw, node, "ends", 2)
    axes, steps = int_list(rw, node, "axes", 3), int_list(rw, node, "steps", 4)
    if not starts or not ends or axes is None or steps is None or len(starts) != 1:
        return 0
    ax = norm_axis(axes[0] if axes else 0, x.rank)
    if ax != norm_axis(int(cat.attrs.get("axis", 0)), x.rank) or (steps and steps[0] != 1):
        return 0
    total = x.shape[ax]
    if not isinstance(total, int):
        return 0
    s, e, _ = slice(starts[0], ends[0]).indices(total)
    pieces = _pieces(rw, cat, ax)
    if pieces is None or e <= s:
        return 0
    for lo, hi, v in pieces:
        if lo <= s and e <= hi:
            if (lo, hi) == (s, e) and v.dtype == out.dtype:     # type: ignore[attr-defined]
                new = v
            else:
                new = rw.op("Slice", [v, rw.const(torch.tensor([s - lo])), rw.const(torch.tensor([e - lo])),
                                      rw.const(torch.tensor([ax]))], like=out, before=node)
            if rw.replace(out, new, before=node):  # type: ignore[arg-type]
                rw.emit(f"slice of concat {node.describe()}", node=node.name)
                return 1
            return 0
    return 0


def _gather_of_concat(rw: Rewriter, node: Node) -> int:
    x, idx_v, out = node.inputs[0], node.inputs[1], node.outputs[0]
    cat = rw.producer(x)
    idx = rw.const_value(idx_v)
    if cat is None or cat.op_type != "Concat" or idx is None or idx.numel() != 1 or x is None or x.rank != 1:
        return 0
    if int(node.attrs.get("axis", 0)) not in (0, -1):
        return 0
    pieces = _pieces(rw, cat, 0)
    if pieces is None:
        return 0
    total = pieces[-1][1] if pieces else 0
    i = int(idx.reshape(()).item())
    i = i + total if i < 0 else i
    for lo, hi, v in pieces:
        if lo <= i < hi:
            new = rw.op("Gather", [v, rw.const(torch.tensor(i - lo, dtype=torch.int64).reshape(idx.shape))],
                        {"axis": 0}, like=out, before=node)
            if rw.replace(out, new, before=node):
                rw.emit(f"gather of concat {node.describe()}", node=node.name)
                return 1
            return 0
    return 0
