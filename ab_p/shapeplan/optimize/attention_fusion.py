"""AttentionFusion: scaled dot-product attention written out as ops -> one ``Attention`` op.

    before (torch.onnx.export of F.scaled_dot_product_attention, Llama with GQA):
        k5 = Expand(Unsqueeze(k, [2]), [B, Hkv, n_rep, S, D])            # repeat_kv
        kt = Reshape(Transpose(Reshape(k5, [-1, S, D]), [0, 2, 1]), [B, H, D, S])
        s  = Add(MatMul(Mul(q, sqrt_scale), Mul(kt, sqrt_scale)), mask)
        p  = Softmax(s, axis=-1);  p = Where(IsNaN(p), 0, p)             # safe-softmax guard
        y  = MatMul(p, Reshape(Expand(Unsqueeze(v, [2]), ...), [B, H, S, D]))
    after:
        y  = Attention(q, k, v, mask, scale=sqrt_scale**2)               # GQA from the head counts

Also matched: ``Transpose(k, [0,1,3,2])`` for Kᵀ, a scale applied after the QKᵀ MatMul
(``Mul``/``Div`` by a scalar constant), no mask, a boolean mask through
``Where(mask, s, -inf)``. Q, K, V must be 4-D ``[B, H, S, D]``. The score/probability
intermediates must have no other reader. The op is emitted in ai.onnx at opset >= 23, else in the
shapeplan domain; when neither has ``Attention`` the pass declines (diagnostics FUSION event).
Note: rows whose mask excludes every key are 0 with the safe-softmax guard; the fused op follows
the Attention kernel's convention there.
"""
from __future__ import annotations

import math

from shapeplan.ir.graph import Graph, Node, Value
from shapeplan.optimize.rewrite import rewrite_ops, Rewriter, int_list


def run(graph: Graph) -> int:
    return rewrite_ops(graph, "AttentionFusion", {"MatMul": _try})


def _p(rw: Rewriter, v: Value | None, ops: tuple[str, ...], single: bool = True) -> Node | None:
    p = rw.producer(v)
    if p is None or p.op_type not in ops or p.domain not in ("", "ai.onnx"):
        return None
    if single and not rw.single_use(v):  # type: ignore[arg-type]
        return None
    return p


def _scaled(rw: Rewriter, v: Value | None, nodes: list[Node]) -> tuple[Value | None, float]:
    """Strip ``Mul(x, c)`` / ``Div(x, c)`` by a scalar constant; returns (x, factor)."""
    m = _p(rw, v, ("Mul", "Div"))
    if m is None:
        return v, 1.0
    for i in ((0, 1) if m.op_type == "Mul" else (0,)):
        c = rw.scalar(m.inputs[1 - i])
        if c is not None and c != 0 and math.isfinite(c):
            nodes.append(m)
            return m.inputs[i], (c if m.op_type == "Mul" else 1.0 / c)
    return v, 1.0


def _swap_last2(perm: list[int] | None, rank: int) -> bool:
    return perm is not None and perm == list(range(rank - 2)) + [rank - 1, rank - 2]


def _untranspose(rw: Rewriter, kt: Value | None, nodes: list[Node]) -> Value | None:
    """K [B,H,S,D] (or its 5-D GQA expansion) from Kᵀ [B,H,D,S]."""
    t = _p(rw, kt, ("Transpose",))
    if t is not None and kt is not None and kt.rank == 4 and _swap_last2(list(t.attrs.get("perm", [])), 4):
        nodes.append(t)
        return t.inputs[0]
    r2 = _p(rw, kt, ("Reshape",))
    t = _p(rw, r2.inputs[0], ("Transpose",)) if r2 is not None else None
    r1 = _p(rw, t.inputs[0], ("Reshape",)) if t is not None else None
    if r1 is None or kt is None or kt.shape is None or kt.rank != 4:
        return None
    if t is None or list(t.attrs.get("perm", [])) != [0, 2, 1]:
        return None
    x = r1.inputs[0]
    if x is None or x.shape is None or x.rank not in (4, 5):
        return None
    # x [..., S, D] flattened to [N, S, D], transposed, reshaped to [B, H, D, S]: check the dims
    s_, d_ = x.shape[-2], x.shape[-1]
    if kt.shape[2] != d_ or kt.shape[3] != s_ or r1.outputs[0].shape is None:
        return None
    if r1.outputs[0].shape[1:] != (s_, d_):
        return None
    nodes.extend([r2, t, r1])
    return x


def _unrepeat(rw: Rewriter, x: Value | None, nodes: list[Node]) -> Value | None:
    """k [B,Hkv,S,D] from HF repeat_kv: Reshape(Expand(Unsqueeze(k, [2]), [B,Hkv,n,S,D]), [B,H,S,D])."""
    if x is None:
        return None
    local: list[Node] = []
    cur = x
    if x.rank == 4:
        r = _p(rw, x, ("Reshape",))
        if r is None:
            return x
        local.append(r)
        cur = r.inputs[0]
        if cur is None or cur.rank != 5:
            return x
    if cur is None or cur.rank != 5:
        return None
    e = _p(rw, cur, ("Expand",))
    u = _p(rw, e.inputs[0], ("Unsqueeze",)) if e is not None else None
    if u is None:
        return None if x.rank == 5 else x
    axes = int_list(rw, u, "axes", 1)
    if axes not in ([2], [-3]):
        return None if x.rank == 5 else x
    k = u.inputs[0]
    if k is None or k.rank != 4 or k.shape is None or cur.shape is None:
        return None if x.rank == 5 else x
    # the expansion must only broadcast the new axis
    if cur.shape[0] != k.shape[0] or cur.shape[1] != k.shape[1] or cur.shape[3:] != k.shape[2:]:
        return None if x.rank == 5 else x
    nodes.extend(local + [e, u])
    return k


def _try(rw: Rewriter, root: Node) -> int:
    nodes: list[Node] = []
    p, v = root.inputs[0], root.inputs[1]
    # optional safe-softmax guard: Where(IsNaN(sm), 0, sm)
    w = _p(rw, p, ("Where",))
    if w is not None:
        isn = _p(rw, w.inputs[0], ("IsNaN",))
        if isn is None or isn.inputs[0] is not w.inputs[2] or rw.scalar(w.inputs[1]) != 0.0:
            return 0
        sm_v = w.inputs[2]
        rs = rw.readers(sm_v)  # type: ignore[arg-type]
        if {id(n) for n in rs} != {id(isn), id(w)} or rw.pinned(sm_v):  # type: ignore[arg-type]
            return 0
        sm = rw.producer(sm_v)
        nodes += [w, isn]
    else:
        sm = _p(rw, p, ("Softmax",))
    if sm is None or sm.op_type != "Softmax":
        return 0
    x = sm.inputs[0]
    if x is None or x.rank != 4:
        return 0
    axis = int(sm.attrs.get("axis", -1 if rw.g.opset("") >= 13 else 1))
    if axis not in (-1, 3):
        return 0
    nodes.append(sm)
    mask: Value | None = None
    s = x
    a = _p(rw, s, ("Add",))
    if a is not None:
        for i in (0, 1):
            if _p(rw, a.inputs[i], ("MatMul", "Mul", "Div")) is not None:
                s, mask = a.inputs[i], a.inputs[1 - i]
                nodes.append(a)
                break
        else:
            return 0
    else:
        wm = _p(rw, s, ("Where",))
        if wm is not None:
            neg = rw.scalar(wm.inputs[2])
            if neg is None or neg > -1e4 or wm.inputs[0] is None or wm.inputs[0].dtype is None or \
                    wm.inputs[0].dtype.name != "bool":
                return 0
            s, mask = wm.inputs[1], wm.inputs[0]
            nodes.append(wm)
    s, post = _scaled(rw, s, nodes)
    qk = _p(rw, s, ("MatMul",))
    if qk is None:
        return 0
    nodes.append(qk)
    q, fq = _scaled(rw, qk.inputs[0], nodes)
    kt, fk = _scaled(rw, qk.inputs[1], nodes)
    k = _untranspose(rw, kt, nodes)
    k = _unrepeat(rw, k, nodes)
    v2 = _unrepeat(rw, v, nodes)
    if q is None or k is None or v2 is None or q.rank != 4 or k.rank != 4 or v2.rank != 4:
        return 0
    if q.dtype is None or q.dtype != k.dtype or q.dtype != v2.dtype or not q.dtype.is_float:
        return 0
    hq, hk, hv = q.shape[1], k.shape[1], v2.shape[1]  # type: ignore[index]
    if hk != hv or (isinstance(hq, int) and isinstance(hk, int) and hq % hk):
        return 0
    if not isinstance(hq, int) and hq != hk:
        return 0
    if q.shape[3] != k.shape[3]:  # type: ignore[index]
        return 0
    if mask is not None and (mask.rank is None or mask.rank < 2 or mask.rank > 4):
        return 0                    # Attention's attn_mask is [.., Sq, Skv]; a scalar score bias is not a mask
    if rw.crosses_mutation(nodes, root):
        return 0
    scale = fq * fk * post
    dom = rw.fused_domain("Attention")
    out = root.outputs[0]
    if dom is None:
        rw.emit(f"attention pattern at {root.describe()}: no Attention op at this opset", declined=True,
                node=root.name)
        return 0
    ins = [q, k, v2] + ([mask] if mask is not None else [])
    new = rw.op("Attention", ins, {"scale": float(scale)}, domain=dom, like=out, before=root)
    if not rw.replace(out, new, before=root):
        return 0
    rw.emit(f"Attention at {root.describe()} (scale={scale:.6g}, heads {hq}/{hk}, "
            f"mask={'yes' if mask is not None else 'no'})", node=root.name, op="Attention")
    return 1
