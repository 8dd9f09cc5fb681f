"""ConvBatchNormFolding: an inference BatchNormalization after a Conv with constant weights -> the Conv.

    before:  y = BatchNormalization(Conv(x, W, B?), scale, bias, mean, var)
    after:   y = Conv(x, W * s, (B - mean) * s + bias)        s = scale / sqrt(var + epsilon), per channel

What ONNX Runtime's Conv + BatchNormalization fusion and torch's ``fuse_conv_bn_eval`` do: a CNN exported
for inference (ResNet, MobileNet, EfficientNet, YOLO) then runs one kernel where it ran two. Applied
when the Conv's result has no other reader, W (and B) and the four statistics are constants (W may
also be a ``ConstantOfShape`` of a constant shape, as ONNX's "light" test models write their weights:
ConstantFolding leaves such large results computed), each statistic a vector of W's output channels,
the BatchNormalization is the inference form (one output; opsets < 9: ``spatial`` 1) and every dtype
is floating point. The new parameters are computed in float64 and rounded once to W's dtype: the
result differs from the unfolded pair by rounding only.
"""
from __future__ import annotations

import torch

from shapeplan.ir.graph import Graph, Node, Value
from shapeplan.optimize import constant_folding
from shapeplan.optimize.rewrite import Rewriter, rewrite_ops


def run(graph: Graph) -> int:
    return rewrite_ops(graph, "ConvBatchNormFolding", {"BatchNormalization": _fold})


def _weight(rw: Rewriter, v: Value | None) -> torch.Tensor | None:
    """The constant tensor ``v`` holds, or the one a ConstantOfShape of a constant shape makes."""
    t = rw.const_value(v)
    if t is not None:
        return t
    p = rw.producer(v)
    if p is None or p.op_type != "ConstantOfShape" or p.domain not in ("", "ai.onnx"):
        return None
    shape = rw.const_value(p.inputs[0])
    outs = None if shape is None else constant_folding.evaluate(rw, p, [shape])
    return None if outs is None else outs[0]


def _fold(rw: Rewriter, bn: Node) -> int:
    y = bn.inputs[0]
    conv = rw.producer(y)
    if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or not rw.single_use(y):
        return 0
    if len(bn.outputs) != 1 or bn.attrs.get("training_mode", 0) or bn.attrs.get("spatial", 1) != 1:
        return 0
    stats = [rw.const_value(v) for v in bn.inputs[1:5]]
    if len(stats) != 4 or any(t is None or not t.is_floating_point() for t in stats):
        return 0
    w = _weight(rw, conv.inputs[1])
    b_in = conv.inputs[2] if len(conv.inputs) > 2 else None
    b = rw.const_value(b_in)
    if w is None or not w.is_floating_point() or w.dim() < 3:
        return 0
    if b_in is not None and (b is None or not b.is_floating_point()):      # a computed bias
        return 0
    n = w.shape[0]
    if any(tuple(t.shape) != (n,) for t in stats) or (b is not None and tuple(b.shape) != (n,)):
        return 0
    out = bn.outputs[0]
    if out.dtype is None or out.dtype.torch != w.dtype:
        return 0
    scale, bias, mean, var = (t.double() for t in stats)
    s = scale / torch.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    w2 = (w.double() * s.reshape(-1, *[1] * (w.dim() - 1))).to(w.dtype)
    b2 = (((b.double() if b is not None else 0.0) - mean) * s + bias).to(w.dtype)
    new = rw.op("Conv", [conv.inputs[0], rw.const(w2), rw.const(b2)], dict(conv.attrs), like=out, before=bn)
    if not rw.replace(out, new, before=bn):
        return 0
    rw.emit(f"folded {bn.describe()} into {conv.describe()}", node=conv.name, op="Conv")
    return 1
