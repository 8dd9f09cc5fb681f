"""ActivationFusion: decomposed activations -> one op.

    before:  silu = Mul(x, Sigmoid(x)); y = Mul(silu, up)          # SwiGLU MLP
    after:   y = shapeplan::SiluMul(x, up)
    before:  Mul(x, Sigmoid(x))                      after: Swish(x)          (ai.onnx opset >= 24)
    before:  Mul(Mul(x, 0.5), Add(Erf(Div(x, 1.4142)), 1))   after: Gelu(x)   (opset >= 20)
    before:  0.5*x*(1 + Tanh(0.79788*(x + 0.044715*x^3)))    after: Gelu(x, approximate="tanh")
    before:  Mul(x, HardSigmoid(x, alpha=1/6, beta=.5))       after: HardSwish(x)

GELU patterns are matched as a product tree: the leaves must be exactly {x, 0.5, 1 + erf(x/√2)}
(any association and operand order; ``x*0.7071`` or ``x/1.4142`` inside erf). When the fused op
is not available at the graph's opset the pass declines with a diagnostics FUSION event.
"""
from __future__ import annotations

import math

from shapeplan.ir.graph import Graph, Node, Value
from shapeplan.optimize.rewrite import rewrite_ops, Rewriter

_C_TANH = math.sqrt(2.0 / math.pi)


def run(graph: Graph) -> int:
    return rewrite_ops(graph, "ActivationFusion", {"Mul": _fuse_mul})


def _fuse_mul(rw: Rewriter, node: Node) -> int:
    return _silu_mul(rw, node) or _gelu(rw, node) or _swish(rw, node) or _hardswish(rw, node)


def _p(rw: Rewriter, v: Value | None, op: str, single: bool = True) -> Node | None:
    p = rw.producer(v)
    if p is None or p.op_type != op or p.domain not in ("", "ai.onnx"):
        return None
    if single and not rw.single_use(v):  # type: ignore[arg-type]
        return None
    return p


def _is_silu(rw: Rewriter, mul: Node) -> Value | None:
    """x when ``mul`` is Mul(x, Sigmoid(x))."""
    for i in (0, 1):
        s = _p(rw, mul.inputs[1 - i], "Sigmoid")
        if s is not None and s.inputs[0] is mul.inputs[i]:
            return mul.inputs[i]
    return None


def _fp(v: Value | None) -> bool:
    return v is not None and v.dtype is not None and v.dtype.is_float


def _emit(rw: Rewriter, node: Node, op: str, ins: list, attrs: dict | None = None,
          domain_pref: str | None = None) -> int:
    dom = domain_pref if domain_pref is not None else rw.fused_domain(op)
    if dom is None or not rw.supported(op, dom):
        rw.emit(f"{op} pattern at {node.describe()}: {op} not available at this opset", declined=True,
                node=node.name)
        return 0
    out = node.outputs[0]
    new = rw.op(op, ins, attrs or {}, domain=dom, like=out, before=node)
    if rw.replace(out, new, before=node):
        rw.emit(f"{op} at {node.describe()}", node=node.name, op=op)
        return 1
    return 0


def _silu_mul(rw: Rewriter, node: Node) -> int:
    for i in (0, 1):
        m = _p(rw, node.inputs[i], "Mul")
        if m is None:
            continue
        x = _is_silu(rw, m)
        up = node.inputs[1 - i]
        if x is None or up is None or not _fp(x) or x.dtype != up.dtype:
            continue
        if x.shape is None or up.shape is None or tuple(x.shape) != tuple(up.shape) or None in x.shape:
            continue
        if not rw.supported("SiluMul", "shapeplan"):
            return 0
        return _emit(rw, node, "SiluMul", [x, up], domain_pref="shapeplan")
    return 0


def _swish(rw: Rewriter, node: Node) -> int:
    x = _is_silu(rw, node)
    if x is None or not _fp(x) or rw.fused_domain("Swish") is None:
        return 0          # x*sigmoid(x) stays as is (and may become SiluMul first)
    if rw.same_type(x, node.outputs[0]) is None:
        return 0
    return _emit(rw, node, "Swish", [x])


def _hardswish(rw: Rewriter, node: Node) -> int:
    for i in (0, 1):
        h = _p(rw, node.inputs[1 - i], "HardSigmoid")
        x = node.inputs[i]
        if h is None or h.inputs[0] is not x or not _fp(x):
            continue
        if not math.isclose(float(h.attrs.get("alpha", 0.2)), 1 / 6, rel_tol=1e-4) or \
                not math.isclose(float(h.attrs.get("beta", 0.5)), 0.5, rel_tol=1e-6):
            continue
        if rw.same_type(x, node.outputs[0]) is None:   # type: ignore[arg-type]
            continue
        return _emit(rw, node, "HardSwish", [x])
    return 0


def _leaves(rw: Rewriter, v: Value, out: list[Value], nodes: list[Node], depth: int = 0) -> None:
    m = _p(rw, v, "Mul") if depth else rw.producer(v)
    if m is not None and m.op_type == "Mul" and depth < 3:
        nodes.append(m)
        for w in m.inputs:
            _leaves(rw, w, out, nodes, depth + 1)  # type: ignore[arg-type]
    else:
        out.append(v)


def _erf_arg_ok(rw: Rewriter, z: Value | None, x: Value) -> bool:
    p = _p(rw, z, "Div") or _p(rw, z, "Mul")
    if p is None:
        return False
    if p.op_type == "Div":
        c = rw.scalar(p.inputs[1])
        return p.inputs[0] is x and c is not None and math.isclose(c, math.sqrt(2), rel_tol=1e-4)
    for i in (0, 1):
        c = rw.scalar(p.inputs[1 - i])
        if p.inputs[i] is x and c is not None and math.isclose(c, 1 / math.sqrt(2), rel_tol=1e-4):
            return True
    return False


def _tanh_arg_ok(rw: Rewriter, z: Value | None, x: Value) -> bool:
    """z = c * (x + 0.044715 * x^3) with c = sqrt(2/pi)."""
    m = _p(rw, z, "Mul")
    if m is None:
        return False
    for i in (0, 1):
        c = rw.scalar(m.inputs[1 - i])
        if c is None or not math.isclose(c, _C_TANH, rel_tol=1e-4):
            continue
        a = _p(rw, m.inputs[i], "Add")
        if a is None:
            return False
        for j in (0, 1):
            if a.inputs[j] is not x:
                continue
            cube = _p(rw, a.inputs[1 - j], "Mul")
            if cube is None:
                return False
            for k in (0, 1):
                c2 = rw.scalar(cube.inputs[1 - k])
                if c2 is None or not math.isclose(c2, 0.044715, rel_tol=1e-4):
                    continue
                x3 = cube.inputs[k]
                pw = _p(rw, x3, "Pow")
                if pw is not None and pw.inputs[0] is x and rw.scalar(pw.inputs[1]) == 3.0:
                    return True
                mm = _p(rw, x3, "Mul")            # x*x*x
                if mm is not None:
                    ins = list(mm.inputs)
                    inner = [rw.producer(w) for w in ins]
                    for q in (0, 1):
                        sq = inner[q]
                        if ins[1 - q] is x and sq is not None and sq.op_type == "Mul" and \
                                list(sq.inputs) == [x, x] and rw.single_use(ins[q]):  # type: ignore[arg-type]
                            return True
    return False


def _gelu(rw: Rewriter, node: Node) -> int:
    leaves: list[Value] = []
    nodes: list[Node] = []
    _leaves(rw, node.outputs[0], leaves, nodes)
    if len(leaves) != 3:
        return 0
    half = [v for v in leaves if rw.scalar(v) == 0.5]
    if len(half) != 1:
        return 0
    rest = [v for v in leaves if v is not half[0]]
    for i in (0, 1):
        x, one_plus = rest[i], rest[1 - i]
        if not _fp(x):
            continue
        add = _p(rw, one_plus, "Add")
        if add is None:
            continue
        for j in (0, 1):
            if rw.scalar(add.inputs[1 - j]) != 1.0:
                continue
            f = rw.producer(add.inputs[j])
            if f is None or not rw.single_use(add.inputs[j]):  # type: ignore[arg-type]
                continue
            if f.op_type == "Erf" and _erf_arg_ok(rw, f.inputs[0], x):
                approx = "none"
            elif f.op_type == "Tanh" and _tanh_arg_ok(rw, f.inputs[0], x):
                approx = "tanh"
            else:
                continue
            if rw.same_type(x, node.outputs[0]) is None:
                return 0
            return _emit(rw, node, "Gelu", [x], {"approximate": approx} if approx == "tanh" else {})
    return 0
