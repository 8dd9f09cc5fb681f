"""NormalizationFusion: decomposed RMSNorm / LayerNorm -> one RMSNormalization / LayerNormalization.

    before (RMSNorm, as exported from HF Llama):
        ms = ReduceMean(Pow(x, 2), axes=[-1]);  r = Reciprocal(Sqrt(Add(ms, eps)))
        y  = Mul(weight, Mul(x, r))
    after:
        y  = RMSNormalization(x, weight, axis=-1, epsilon=eps)

    before (LayerNorm):
        d = Sub(x, ReduceMean(x, [-1])); v = ReduceMean(Pow(d, 2), [-1])
        y = Add(Mul(Div(d, Sqrt(Add(v, eps))), gamma), beta)
    after:
        y = LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps)

Accepted variants: x*x for pow(x,2); Reciprocal(Sqrt(.)), Pow(., -0.5), Div(1, Sqrt(.)) for rsqrt;
Div(x, Sqrt(.)) for x*rsqrt; the scale multiply optional (a ones scale is made) and in either
operand order. The reduced axes must be the trailing ones (keepdims=1), eps a scalar constant,
and gamma/beta constants shaped like the normalized dims. RMSNormalization is emitted in ai.onnx
at opset >= 23, else in the shapeplan domain; LayerNormalization needs opset >= 17.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph, Node, Value
from shapeplan.optimize.rewrite import Rewriter, int_list, norm_axis


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "NormalizationFusion")
    count = 0
    for node in reversed(list(graph.nodes)):      # outermost first: scale/bias belong to the match
        if node in rw.dead or node.op_type not in ("Mul", "Div", "Add") or node.domain not in ("", "ai.onnx"):
            continue
        count += _try(rw, node)
    rw.commit()
    return count


def _prod(rw: Rewriter, v: Value | None, op: str | tuple[str, ...], single: bool = True) -> Node | None:
    p = rw.producer(v)
    ops = (op,) if isinstance(op, str) else op
    if p is None or p.op_type not in ops or p.domain not in ("", "ai.onnx"):
        return None
    if single and not rw.single_use(v):  # type: ignore[arg-type]
        return None
    return p


def _const_scalar(rw: Rewriter, v: Value | None) -> float | None:
    return rw.scalar(v)


def _other(node: Node, v: Value) -> Value | None:
    a, b = node.inputs[0], node.inputs[1]
    return b if a is v else a if b is v else None


def _trailing_axis(rw: Rewriter, red: Node, rank: int | None) -> int | None:
    """The ReduceMean's axes as a LayerNorm-style ``axis`` (trailing dims), else None."""
    if int(red.attrs.get("keepdims", 1)) != 1:
        return None
    axes = int_list(rw, red, "axes", 1)
    if not axes:
        return None
    if rank is None:
        if not all(a < 0 for a in axes):
            return None
        k = len(axes)
        return -k if sorted(axes) == list(range(-k, 0)) else None
    na = sorted(norm_axis(a, rank) for a in axes)  # type: ignore[type-var]
    return na[0] - rank if na == list(range(na[0], rank)) else None


def _square_of(rw: Rewriter, v: Value | None) -> Value | None:
    """x when v = Pow(x, 2) or Mul(x, x)."""
    p = _prod(rw, v, ("Pow", "Mul"))
    if p is None:
        return None
    if p.op_type == "Mul":
        return p.inputs[0] if p.inputs[0] is p.inputs[1] else None
    return p.inputs[0] if rw.scalar(p.inputs[1]) == 2.0 else None


def _inv_std(rw: Rewriter, v: Value | None, divide: bool) -> tuple[Value, float, list[Node]] | None:
    """(mean-square value, eps, nodes) when v = rsqrt(ms + eps) (or sqrt(ms + eps) if ``divide``)."""
    nodes: list[Node] = []
    if divide:
        s = _prod(rw, v, "Sqrt")
        if s is None:
            return None
        nodes.append(s)
        inner = s.inputs[0]
    else:
        r = _prod(rw, v, ("Reciprocal", "Pow", "Div"))
        if r is None:
            return None
        nodes.append(r)
        if r.op_type == "Pow":
            if rw.scalar(r.inputs[1]) != -0.5:
                return None
            inner = r.inputs[0]
        else:
            if r.op_type == "Div" and rw.scalar(r.inputs[0]) != 1.0:
                return None
            s = _prod(rw, r.inputs[0] if r.op_type == "Reciprocal" else r.inputs[1], "Sqrt")
            if s is None:
                return None
            nodes.append(s)
            inner = s.inputs[0]
    add = _prod(rw, inner, "Add")
    if add is None:
        return None
    for i in (0, 1):
        eps = rw.scalar(add.inputs[1 - i])
        if eps is not None:
            nodes.append(add)
            return add.inputs[i], eps, nodes  # type: ignore[return-value]
    return None


def _normalized(rw: Rewriter, node: Node):  # noqa: ANN202
    """Match n = x * rsqrt(ms + eps) or x / sqrt(ms + eps) at ``node``; returns (x, ms, eps, nodes)."""
    if node.op_type == "Div":
        got = _inv_std(rw, node.inputs[1], divide=True)
        return None if got is None else (node.inputs[0], got[0], got[1], got[2])
    if node.op_type != "Mul":
        return None
    for i in (0, 1):
        got = _inv_std(rw, node.inputs[1 - i], divide=False)
        if got is not None:
            return node.inputs[i], got[0], got[1], got[2]
    return None


def _weight_ok(w: torch.Tensor | None, x: Value, axis: int) -> bool:
    if w is None or x.shape is None:
        return False
    norm = tuple(x.shape[axis:])
    shape = tuple(w.shape)
    while shape and shape[0] == 1 and len(shape) > len(norm):
        shape = shape[1:]
    return shape == norm


def _try(rw: Rewriter, node: Node) -> int:
    # root candidates: Add(Mul(n, gamma), beta) | Mul(n, gamma) | n
    beta = gamma = None
    core = node
    if node.op_type == "Add":
        for i in (0, 1):
            b = rw.const_value(node.inputs[1 - i])
            m = _prod(rw, node.inputs[i], "Mul")
            if b is not None and m is not None:
                beta, core = node.inputs[1 - i], m
                break
        else:
            return 0
    if core.op_type == "Mul":
        for i in (0, 1):
            g = rw.const_value(core.inputs[1 - i])
            inner = _prod(rw, core.inputs[i], ("Mul", "Div"))
            if g is not None and inner is not None and _normalized(rw, inner) is not None:
                gamma, core = core.inputs[1 - i], inner
                break
    if beta is not None and gamma is None:
        return 0
    got = _normalized(rw, core)
    if got is None:
        return 0
    x, ms, eps, nodes = got
    red = _prod(rw, ms, "ReduceMean")
    if red is None or x is None:
        return 0
    sq = _square_of(rw, red.inputs[0])
    if sq is None:
        return 0
    axis = _trailing_axis(rw, red, x.rank)
    if axis is None:
        return 0
    out = node.outputs[0]
    if x.dtype is None or x.dtype != out.dtype or not x.dtype.is_float:
        return 0
    # LayerNorm when x == Sub(x0, ReduceMean(x0)) and the numerator is that same centered value
    kind, src = "RMSNormalization", x
    if sq is not x:
        return 0
    sub = rw.producer(x)
    if sub is not None and sub.op_type == "Sub" and sub.domain in ("", "ai.onnx"):
        mean = _prod(rw, sub.inputs[1], "ReduceMean")
        if mean is not None and mean.inputs[0] is sub.inputs[0] and \
                _trailing_axis(rw, mean, sub.inputs[0].rank) == axis and \
                len({id(n) for n in rw.readers(x)}) == 2 and not rw.pinned(x):
            kind, src = "LayerNormalization", sub.inputs[0]
    if src is None or src.dtype != out.dtype:
        return 0
    gt = rw.const_value(gamma)
    if gamma is not None and (not _weight_ok(gt, src, axis) or gt.dtype != src.dtype.torch):  # type: ignore[union-attr]
        return 0
    if gamma is None:
        if src.shape is None or not all(isinstance(d, int) for d in src.shape[axis:]):
            return 0
        gamma = rw.const(torch.ones(tuple(src.shape[axis:]), dtype=src.dtype.torch))  # type: ignore[arg-type, misc]
    elif gt is not None and tuple(gt.shape) != tuple(src.shape[axis:]):  # type: ignore[index]
        gamma = rw.const(gt.reshape(tuple(src.shape[axis:])))  # type: ignore[index, arg-type]
    if beta is not None:
        bt = rw.const_value(beta)
        if not _weight_ok(bt, src, axis) or bt.dtype != src.dtype.torch:  # type: ignore[union-attr]
            return 0
        if tuple(bt.shape) != tuple(src.shape[axis:]):  # type: ignore[union-attr, index]
            beta = rw.const(bt.reshape(tuple(src.shape[axis:])))  # type: ignore[union-attr, index, arg-type]
    if kind == "LayerNormalization" and not rw.supported("LayerNormalization"):
        rw.emit(f"LayerNorm pattern at {node.describe()}: LayerNormalization needs opset >= 17",
                declined=True, node=node.name)
        return 0
    if rw.crosses_mutation(nodes + [red], node):
        return 0
    if kind == "RMSNormalization":
        dom = rw.fused_domain("RMSNormalization")
        if dom is None:
            return 0
        new = rw.op("RMSNormalization", [src, gamma], {"axis": axis, "epsilon": float(eps)},
                    domain=dom, like=out, before=node)
    else:
        new = rw.op("LayerNormalization", [src, gamma] + ([beta] if beta is not None else []),
                    {"axis": axis, "epsilon": float(eps)}, like=out, before=node)
    if not rw.replace(out, new, before=node):
        return 0
    rw.emit(f"{kind} at {node.describe()} (axis={axis}, eps={eps:g})", node=node.name, op=kind)
    return 1
