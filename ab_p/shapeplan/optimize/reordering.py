"""Reordering: transpose chains collapse; 2-D transposes fold into MatMul/Gemm flags.

    before:  t = Transpose(Transpose(x, [0,2,1,3]), [0,2,1,3]);  y = MatMul(Transpose(a:[K,M]), b:[K,N])
    after:   t -> x;                                             y = Gemm(a, b, transA=1)

``Transpose(Transpose(x, p1), p2)`` is ``Transpose(x, q)`` with ``q[i] = p1[p2[i]]`` (or x itself
when q is the identity). A rank-2 ``Transpose`` feeding a Gemm input flips transA/transB; a rank-2
MatMul with a transposed operand becomes a Gemm (floating point only).
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph, Node
from shapeplan.optimize.rewrite import Match, P, apply_rules, is_float


def _perm(node: Node) -> list[int] | None:
    p = node.attrs.get("perm")
    if p is not None:
        return [int(i) for i in p]
    r = node.inputs[0].rank if node.inputs and node.inputs[0] is not None else None
    return None if r is None else list(range(r))[::-1]


def double_transpose(m: Match):  # noqa: ANN201
    p1, p2 = _perm(m["inner"]), _perm(m.root)
    if p1 is None or p2 is None or len(p1) != len(p2):
        return None
    q = [p1[i] for i in p2]
    if q == list(range(len(q))):
        return m["x"]                            # the composition is the identity
    return m.op("Transpose", m["x"], perm=q, like=m.out)


def _is_2d_swap(n: Node) -> bool:
    x = n.inputs[0]
    return x is not None and x.rank == 2 and _perm(n) == [1, 0]


def gemm_trans_a(m: Match):  # noqa: ANN201
    a = m["a"]
    attrs = dict(m.root.attrs)
    attrs["transA"] = 1 - int(attrs.get("transA", 0))
    return m.op("Gemm", a, *m.root.inputs[1:], like=m.out, **attrs)


def gemm_trans_b(m: Match):  # noqa: ANN201
    attrs = dict(m.root.attrs)
    attrs["transB"] = 1 - int(attrs.get("transB", 0))
    ins = list(m.root.inputs)
    ins[1] = m["b"]
    return m.op("Gemm", *ins, like=m.out, **attrs)


def matmul_t(m: Match):  # noqa: ANN201
    if not is_float(m.out) or not m.rw.supported("Gemm"):
        return None
    a_node, b_node = m.get("ta"), m.get("tb")
    a = a_node.inputs[0] if a_node is not None else m["a"]
    b = b_node.inputs[0] if b_node is not None else m["b"]
    if a.rank != 2 or b.rank != 2:
        return None
    return m.op("Gemm", a, b, transA=int(a_node is not None), transB=int(b_node is not None), like=m.out)


_T2 = dict(pred=_is_2d_swap)
RULES = [
    (P("Transpose", P("Transpose", "x", name="inner")), double_transpose),
    (P("Gemm", P("Transpose", "a", **_T2), "b_any"), gemm_trans_a),
    (P("Gemm", P("Transpose", "a", **_T2), "b_any", "c_any"), gemm_trans_a),
    (P("Gemm", "a_any", P("Transpose", "b", **_T2)), gemm_trans_b),
    (P("Gemm", "a_any", P("Transpose", "b", **_T2), "c_any"), gemm_trans_b),
    (P("MatMul", P("Transpose", "a0", name="ta", **_T2), "b"), matmul_t),
    (P("MatMul", "a", P("Transpose", "b0", name="tb", **_T2)), matmul_t),
]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "Reordering")
