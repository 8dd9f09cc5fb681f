"""MatMulAddFusion: MatMul + bias Add -> Gemm (2-D operands).

    before:  y = Add(MatMul(a:[M,K], b:[K,N]), c:[N])
    after:   y = Gemm(a, b, c)

Applied when both MatMul operands are rank 2, the MatMul result has no other reader, the bias
broadcasts unidirectionally to [M, N] (Gemm's rule) and the dtype is floating point. Higher-rank
"linear with bias" stays MatMul + Add (Gemm is 2-D only).
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph
from shapeplan.ops.shape_fns import broadcast_shapes
from shapeplan.optimize.rewrite import Match, P, apply_rules, is_float, shapes_equal


def matmul_add(m: Match):  # noqa: ANN201
    a, b, c = m["a"], m["b"], m["c"]
    mm = m["mm"].outputs[0]
    if a.rank != 2 or b.rank != 2 or c.shape is None or mm.shape is None or not is_float(m.out):
        return None
    if c.dtype != mm.dtype or c.rank is None or c.rank > 2 or not m.rw.supported("Gemm"):
        return None
    try:
        if not shapes_equal(broadcast_shapes(mm.shape, c.shape), mm.shape):
            return None
    except Exception:  # noqa: BLE001
        return None
    return m.op("Gemm", a, b, c, like=m.out)


RULES = [(P("Add", P("MatMul", "a", "b", name="mm"), "c"), matmul_add)]


def run(graph: Graph) -> int:
    return apply_rules(graph, RULES, "MatMulAddFusion")
