"""ShapeFolding: Shape / Size / rank of statically known shapes become constants.

    before:  s = Shape(x:[2,3,4]); n = Size(x); r = Size(Shape(x))
    after:   s = const [2,3,4];    n = const 24; r = const 3

Also partially-known shapes: ``Gather(Shape(x:[batch,128]), 1)`` -> const 128 and
``Slice(Shape(x), 1, 2)`` when the selected dims are all static.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph, Node, Value
from shapeplan.optimize.rewrite import Rewriter, int_list


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "ShapeFolding")
    count = 0
    for node in list(graph.nodes):
        if node in rw.dead or node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        t = _fold(rw, node)
        if t is not None:
            new = rw.const(t)
            if rw.replace(node.outputs[0], new, before=node):
                count += 1
                rw.emit(f"{node.describe()} -> constant {t.tolist()}", node=node.name)
    rw.commit()
    return count


def _shape_range(node: Node, rank: int) -> tuple[int, int]:
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else int(end)
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, end


def _fold(rw: Rewriter, node: Node) -> torch.Tensor | None:
    op = node.op_type
    x: Value | None = node.inputs[0] if node.inputs else None
    if x is None:
        return None
    if op == "Shape" and x.is_static:
        s, e = _shape_range(node, len(x.shape))  # type: ignore[arg-type]
        return torch.tensor(list(x.shape[s:e]), dtype=torch.int64)  # type: ignore[index]
    if op == "Size" and x.is_static:
        n = 1
        for d in x.shape:  # type: ignore[union-attr]
            n *= int(d)  # type: ignore[arg-type]
        return torch.tensor(n, dtype=torch.int64)
    src = rw.producer(x)
    if src is None or src.op_type != "Shape" or src.inputs[0] is None or src.inputs[0].shape is None:
        return None
    full = src.inputs[0].shape
    s, e = _shape_range(src, len(full))
    dims = list(full[s:e])
    if op == "Size":                                   # rank
        return torch.tensor(len(dims), dtype=torch.int64)
    if op == "Gather" and int(node.attrs.get("axis", 0)) == 0:
        idx = rw.const_value(node.inputs[1])
        if idx is None:
            return None
        picked = [dims[int(i)] for i in idx.reshape(-1).tolist()]
        if all(isinstance(d, int) for d in picked):
            return torch.tensor(picked, dtype=torch.int64).reshape(tuple(idx.shape))
        return None
    if op == "Slice":
        starts, ends = int_list(rw, node, "starts", 1), int_list(rw, node, "ends", 2)
        axes, steps = int_list(rw, node, "axes", 3), int_list(rw, node, "steps", 4)
        if not starts or not ends or axes is None or steps is None or (axes and axes[0] not in (0, -1)):
            return None
        step = steps[0] if steps else 1
        n = len(dims)
        st, en = starts[0], ends[0]
        sel = list(range(n))[slice(max(-n - 1, min(st, n)), max(-n - 1, min(en, n)), step)]
        picked = [dims[i] for i in sel]
        if all(isinstance(d, int) for d in picked):
            return torch.tensor(picked, dtype=torch.int64)
    return None
