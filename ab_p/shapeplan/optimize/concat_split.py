"""ConcatSplitSimplification: Split of a Concat, Concat of a Split, nested Concats.

    before:  a2, b2 = Split(Concat(a:[2,4], b:[3,4], axis=0), [2,3], axis=0);  y = Concat(Concat(p, q), r)
    after:   a2 -> a, b2 -> b;                                               y = Concat(p, q, r)

Also ``Concat(s0, s1, ..., sn)`` of *all* outputs of ``Split(x)`` in order, on the same axis -> x.
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph, Node
from shapeplan.optimize.rewrite import rewrite_ops, Rewriter, norm_axis


def run(graph: Graph) -> int:
    return rewrite_ops(graph, "ConcatSplitSimplification", {"Split": _split_of_concat, "Concat": _concat})


def _axis(n: Node, rank: int | None) -> int | None:
    return norm_axis(int(n.attrs.get("axis", 0)), rank)


def _split_sizes(rw: Rewriter, split: Node) -> list[int] | None:
    x = split.inputs[0]
    if x is None or x.rank is None:
        return None
    sizes = [o.shape[_axis(split, x.rank)] if o.shape is not None else None for o in split.outputs]  # type: ignore[index]
    return sizes if all(isinstance(s, int) for s in sizes) else None  # type: ignore[return-value]


def _split_of_concat(rw: Rewriter, split: Node) -> int:
    x = split.inputs[0]
    cat = rw.producer(x)
    if cat is None or cat.op_type != "Concat" or x is None or x.rank is None:
        return 0
    if _axis(cat, x.rank) != _axis(split, x.rank):
        return 0
    ax = _axis(split, x.rank)
    parts = [v for v in cat.inputs if v is not None]
    sizes = _split_sizes(rw, split)
    if sizes is None or len(parts) != len(sizes):
        return 0
    if any(p.shape is None or p.shape[ax] != s for p, s in zip(parts, sizes)):  # type: ignore[index]
        return 0
    n = 0
    for o, p in zip(split.outputs, parts):
        if o.name and p.dtype == o.dtype and rw.replace(o, p, before=split):
            n += 1
    if n:
        rw.emit(f"split of concat {split.describe()}", node=split.name)
    return n


def _concat(rw: Rewriter, cat: Node) -> int:
    out = cat.outputs[0]
    ins = [v for v in cat.inputs if v is not None]
    ax = _axis(cat, out.rank)
    if ax is None or not ins:
        return 0
    # Concat of all outputs of one Split, in order, on the same axis -> the split input
    p0 = rw.producer(ins[0])
    if p0 is not None and p0.op_type == "Split" and len(ins) == len(p0.outputs) and \
            all(a is b for a, b in zip(ins, p0.outputs)) and _axis(p0, out.rank) == ax:
        src = p0.inputs[0]
        if src is not None and src.dtype == out.dtype and rw.replace(out, src, before=cat):
            rw.emit(f"concat of split {cat.describe()}", node=cat.name)
            return 1
    # flatten nested single-use Concats on the same axis
    flat: list = []
    merged = False
    for v in ins:
        p = rw.producer(v)
        if p is not None and p.op_type == "Concat" and rw.single_use(v) and _axis(p, v.rank) == ax:
            flat.extend(w for w in p.inputs if w is not None)
            merged = True
        else:
            flat.append(v)
    if not merged:
        return 0
    new = rw.op("Concat", flat, {"axis": int(cat.attrs.get("axis", 0))}, like=out, before=cat)
    if rw.replace(out, new, before=cat):
        rw.emit(f"flattened nested concat {cat.describe()}", node=cat.name)
        return 1
    return 0
