"""HorizontalFusion: sibling MatMuls that read the same input with constant weights -> one MatMul.

    before:  q = MatMul(h, Wq:[D,Nq]);  k = MatMul(h, Wk:[D,Nk]);  v = MatMul(h, Wv:[D,Nv])
    after:   qkv = MatMul(h, concat(Wq, Wk, Wv):[D, Nq+Nk+Nv]);  q, k, v = Split(qkv, [Nq,Nk,Nv], axis=-1)

QKV projections and the gate/up projections of a SwiGLU MLP are the usual customers. When every
sibling's only reader is an ``Add`` of a constant bias shaped ``[N_i]``, the biases are
concatenated too (one Add before the Split). Needs >= 2 siblings with 2-D constant weights of one
dtype and the same K; the shared input must not be state that a MUTATES_INPUT node writes.
The fused MatMul is placed where the first sibling was.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph, Node, Value, ValueKind
from shapeplan.optimize.rewrite import Rewriter

_MAX_BYTES = 1 << 30


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "HorizontalFusion")
    groups: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        a, w = node.inputs[0], node.inputs[1]
        t = rw.const_value(w)
        if a is None or t is None or t.dim() != 2 or a.rank is None or a.rank < 2:
            continue
        if id(a) in rw.mutated or a.kind is ValueKind.VARIABLE:
            continue
        groups.setdefault(id(a), []).append(node)
    count = 0
    for sibs in groups.values():
        if len(sibs) < 2:
            continue
        # one group per (dtype, K): usually all of them
        by_key: dict[tuple, list[Node]] = {}
        for n in sibs:
            t = rw.const_value(n.inputs[1])
            by_key.setdefault((t.dtype, t.shape[0]), []).append(n)  # type: ignore[union-attr]
        for grp in by_key.values():
            if len(grp) >= 2:
                count += _fuse(rw, grp)
    rw.commit()
    return count


def _bias_of(rw: Rewriter, n: Node) -> tuple[Node, torch.Tensor] | None:
    out = n.outputs[0]
    rs = rw.readers(out)
    if len(rs) != 1 or rw.pinned(out) or rs[0].op_type != "Add" or rs[0].domain not in ("", "ai.onnx"):
        return None
    add = rs[0]
    other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    b = rw.const_value(other)
    w = rw.const_value(n.inputs[1])
    if b is None or w is None or b.dtype != w.dtype:
        return None
    if tuple(b.shape) != (w.shape[1],):
        return None
    if add.outputs[0].shape is None or out.shape is None or tuple(add.outputs[0].shape) != tuple(out.shape):
        return None
    return add, b


def _fuse(rw: Rewriter, grp: list[Node]) -> int:
    a = grp[0].inputs[0]
    ws = [rw.const_value(n.inputs[1]) for n in grp]
    if sum(w.numel() * w.element_size() for w in ws) > _MAX_BYTES:  # type: ignore[union-attr]
        return 0
    sizes = [int(w.shape[1]) for w in ws]  # type: ignore[union-attr]
    first = min(grp, key=lambda n: rw.pos.get(n, 0))
    biases = [_bias_of(rw, n) for n in grp]
    with_bias = all(b is not None for b in biases)
    if rw.crosses_mutation(grp, max(grp, key=lambda n: rw.pos.get(n, 0))):
        return 0
    wcat = rw.const(torch.cat(ws, dim=1))  # type: ignore[arg-type]
    like = grp[0].outputs[0]
    fused_shape = None
    if like.shape is not None:
        fused_shape = tuple(like.shape[:-1]) + (sum(sizes),)
    mm = rw.op("MatMul", [a, wcat], before=first)
    mm.shape = mm.shape or fused_shape
    mm.dtype = mm.dtype or like.dtype
    src = mm
    if with_bias:
        bcat = rw.const(torch.cat([b[1] for b in biases]))  # type: ignore[index]
        src = rw.op("Add", [mm, bcat], before=first)
        src.shape, src.dtype = src.shape or fused_shape, src.dtype or like.dtype
    split_attrs: dict = {"axis": -1}
    split_ins: list[Value | None] = [src]
    if rw.g.opset("") >= 13:
        split_ins.append(rw.const(torch.tensor(sizes, dtype=torch.int64)))
    else:
        split_attrs["split"] = sizes
    parts = rw.op("Split", split_ins, split_attrs, n_out=len(grp), before=first)
    olds = [(b[0] if with_bias else n) for n, b in zip(grp, biases)]  # type: ignore[index]
    for old, part in zip(olds, parts):
        o = old.outputs[0]
        part.dtype = part.dtype or o.dtype
        part.shape = part.shape or o.shape
        rw.replace(o, part, before=first)
    rw.emit(f"fused {len(grp)} MatMuls on %{a.name} (N={sizes}{', with bias' if with_bias else ''})",  # type: ignore[union-attr]
            node=first.name, op="MatMul")
    return 1
