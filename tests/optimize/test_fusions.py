"""NormalizationFusion, AttentionFusion, ActivationFusion, HorizontalFusion, MatMulAddFusion."""
import math

import numpy as np

import shapeplan as sp
from shapeplan.optimize import (activation_fusion, attention_fusion, horizontal_fusion, matmul_add,
                                normalization_fusion)

from tests.optimize.util import assert_same, need, ops_of, run_pass

I64 = np.int64
R = np.random.default_rng(0)


def _w(*shape):
    return R.standard_normal(shape).astype(np.float32)


def _rms(g, x, d, weight=True):
    o = g.op
    ms = o.ReduceMean(o.Pow(x, np.float32(2)), np.array([-1], I64), keepdims=1)
    n = o.Mul(x, o.Reciprocal(o.Sqrt(o.Add(ms, np.float32(1e-6)))))
    return o.Mul(_w(d), n) if weight else n


def test_rmsnorm_fusion():
    need("ReduceMean")
    g = sp.Graph(); x = g.placeholder("x", "float32", (2, 5, 8))
    g.set_outputs(g.op.Relu(_rms(g, x, 8)))
    g2, n = run_pass(g, normalization_fusion.run)
    assert n == 1 and ops_of(g2) == ["RMSNormalization", "Relu"]
    assert_same(g, g2, atol=1e-4)


def test_layernorm_fusion():
    need("ReduceMean", "LayerNormalization")
    g = sp.Graph(); x = g.placeholder("x", "float32", (2, 5, 8))
    o = g.op
    d = o.Sub(x, o.ReduceMean(x, np.array([-1], I64), keepdims=1))
    v = o.ReduceMean(o.Mul(d, d), np.array([-1], I64), keepdims=1)
    y = o.Add(o.Mul(o.Div(d, o.Sqrt(o.Add(v, np.float32(1e-5)))), _w(8)), _w(8))
    g.set_outputs(y)
    g2, n = run_pass(g, normalization_fusion.run)
    assert n == 1 and ops_of(g2) == ["LayerNormalization"]
    assert_same(g, g2, atol=1e-4)


def test_norm_not_fused_when_intermediate_escapes():
    need("ReduceMean")
    g = sp.Graph(); x = g.placeholder("x", "float32", (2, 8))
    o = g.op
    ms = o.ReduceMean(o.Pow(x, np.float32(2)), np.array([-1], I64), keepdims=1)
    g.set_outputs(o.Mul(x, o.Reciprocal(o.Sqrt(o.Add(ms, np.float32(1e-6))))), ms)
    assert run_pass(g, normalization_fusion.run)[1] == 0


def _attn(g, q, k, v, mask=None, gqa=1):
    o = g.op
    if gqa > 1:
        b, h, s, d = k.shape
        rep = lambda t: o.Reshape(o.Expand(o.Unsqueeze(t, np.array([2], I64)), np.array([b, h, gqa, s, d], I64)),  # noqa: E731
                                  np.array([b, h * gqa, s, d], I64))
        k, v = rep(k), rep(v)
    s = o.Mul(o.MatMul(q, o.Transpose(k, perm=[0, 1, 3, 2])), np.float32(1 / math.sqrt(q.shape[-1])))
    if mask is not None:
        s = o.Add(s, mask)
    return o.MatMul(o.Softmax(s, axis=-1), v)


def test_attention_fusion_gqa_mask():
    need("MatMul", "Softmax", "Unsqueeze")
    if attention_fusion.Rewriter(sp.Graph(), "").fused_domain("Attention") is None:
        import pytest
        pytest.skip("Attention op not in the table yet")
    g = sp.Graph()
    q = g.placeholder("q", "float32", (1, 4, 6, 8))
    k = g.placeholder("k", "float32", (1, 2, 6, 8))
    v = g.placeholder("v", "float32", (1, 2, 6, 8))
    mask = np.triu(np.full((6, 6), -np.inf, np.float32), 1)[None, None]
    g.set_outputs(_attn(g, q, k, v, mask, gqa=2))
    g2, n = run_pass(g, attention_fusion.run)
    assert n == 1 and ops_of(g2) == ["Attention"]
    assert_same(g, g2, atol=1e-5)


def test_attention_not_fused_when_probs_escape():
    need("MatMul", "Softmax")
    g = sp.Graph()
    q = g.placeholder("q", "float32", (1, 2, 4, 8))
    o = g.op
    p = o.Softmax(o.MatMul(q, o.Transpose(q, perm=[0, 1, 3, 2])), axis=-1)
    g.set_outputs(o.MatMul(p, q), p)
    assert run_pass(g, attention_fusion.run)[1] == 0


def test_silu_mul_and_gelu():
    g = sp.Graph(opset=21); a = g.placeholder("a", "float32", (3, 8)); b = g.placeholder("b", "float32", (3, 8))
    o = g.op
    s = o.Mul(o.Mul(a, o.Sigmoid(a)), b)
    ge = o.Mul(o.Mul(b, np.float32(0.5)), o.Add(o.Erf(o.Div(b, np.float32(math.sqrt(2)))), np.float32(1)))
    g.set_outputs(s, ge)
    g2, n = run_pass(g, activation_fusion.run)
    assert n == 2 and ops_of(g2) == ["SiluMul", "Gelu"]
    assert_same(g, g2, atol=1e-5)


def test_gelu_declined_below_opset_20():
    g = sp.Graph(opset=18); b = g.placeholder("b", "float32", (3, 8))
    o = g.op
    g.set_outputs(o.Mul(o.Mul(b, np.float32(0.5)), o.Add(o.Erf(o.Div(b, np.float32(math.sqrt(2)))), np.float32(1))))
    assert run_pass(g, activation_fusion.run)[1] == 0


def test_hardswish_and_tanh_gelu():
    g = sp.Graph(opset=21); x = g.placeholder("x", "float32", (3, 8))
    o = g.op
    hs = o.Mul(x, o.HardSigmoid(x, alpha=1 / 6, beta=0.5))
    inner = o.Mul(o.Add(x, o.Mul(o.Pow(x, np.float32(3)), np.float32(0.044715))), np.float32(math.sqrt(2 / math.pi)))
    tg = o.Mul(o.Mul(x, np.float32(0.5)), o.Add(o.Tanh(inner), np.float32(1)))
    g.set_outputs(hs, tg)
    g2, n = run_pass(g, activation_fusion.run)
    assert n == 2 and ops_of(g2) == ["HardSwish", "Gelu"] and g2.nodes[1].attrs["approximate"] == "tanh"
    assert_same(g, g2, atol=1e-5)


def test_horizontal_fusion_with_bias():
    need("MatMul")
    g = sp.Graph(); h = g.placeholder("h", "float32", (2, 5, 8))
    o = g.op
    outs = [o.Add(o.MatMul(h, _w(8, n)), _w(n)) for n in (8, 4, 4)]
    g.set_outputs(*[o.Relu(t) for t in outs])
    g2, n = run_pass(g, horizontal_fusion.run)
    assert n == 1 and ops_of(g2)[:3] == ["MatMul", "Add", "Split"] and ops_of(g2).count("MatMul") == 1
    assert_same(g, g2, atol=1e-5)


def test_horizontal_fusion_needs_constant_weights():
    need("MatMul")
    g = sp.Graph(); h = g.placeholder("h", "float32", (5, 8)); w = g.placeholder("w", "float32", (8, 8))
    g.set_outputs(g.op.MatMul(h, w), g.op.MatMul(h, _w(8, 8)))
    assert run_pass(g, horizontal_fusion.run)[1] == 0


def test_matmul_add_to_gemm():
    need("MatMul", "Gemm")
    g = sp.Graph(); a = g.placeholder("a", "float32", (5, 8))
    g.set_outputs(g.op.Add(g.op.MatMul(a, _w(8, 3)), _w(3)))
    g2, n = run_pass(g, matmul_add.run)
    assert n == 1 and ops_of(g2) == ["Gemm"]
    assert_same(g, g2, atol=1e-5)


def test_matmul_add_3d_kept():
    need("MatMul", "Gemm")
    g = sp.Graph(); a = g.placeholder("a", "float32", (2, 5, 8))
    g.set_outputs(g.op.Add(g.op.MatMul(a, _w(8, 3)), _w(3)))
    assert run_pass(g, matmul_add.run)[1] == 0


# ---------------------------------------------------------------------------------------- ConvBatchNormFolding
def _conv_bn(bias: bool = True, group: int = 1, weight_of_shape: bool = False, training: int = 0,
             escape: bool = False) -> sp.Graph:
    g = sp.Graph(opset=15 if training else 17)
    o = g.op
    x = g.placeholder("x", "float32", (2, 4, 9, 9))
    if weight_of_shape:                      # ONNX's "light" models write their weights this way
        w = o.ConstantOfShape(np.array([6, 4 // group, 3, 3], I64), value=np.array([0.05], np.float32))
    else:
        w = _w(6, 4 // group, 3, 3)
    ins = [x, w] + ([_w(6)] if bias else [])
    y = o.Conv(*ins, pads=[1, 1, 1, 1], strides=[2, 1], group=group)
    var = (R.random(6) + 0.5).astype(np.float32)
    z = o.BatchNormalization(y, _w(6), _w(6), _w(6), var, epsilon=1e-3, training_mode=training)
    g.set_outputs(o.Relu(z), *([y] if escape else []))
    return g


def test_conv_bn_folding():
    from shapeplan.optimize import conv_bn, optimize_with_report
    for kw in (dict(), dict(bias=False), dict(group=2), dict(weight_of_shape=True)):
        g = _conv_bn(**kw)
        g2, n = run_pass(g, conv_bn.run)
        assert n == 1 and ops_of(g2) == ["Conv", "Relu"], (kw, ops_of(g2))
        assert_same(g, g2, rtol=1e-4, atol=1e-5)
        assert optimize_with_report(g)[1].applied("ConvBatchNormFolding") == 1


def test_conv_bn_not_folded():
    from shapeplan.optimize import conv_bn
    assert run_pass(_conv_bn(escape=True), conv_bn.run)[1] == 0      # the Conv's result is read elsewhere too
    assert run_pass(_conv_bn(training=1), conv_bn.run)[1] == 0       # batch statistics: not an inference BN
    g = sp.Graph(opset=17)                                             # the statistics are computed
    x = g.placeholder("x", "float32", (2, 4, 5, 5)); s = g.placeholder("s", "float32", (6,))
    g.set_outputs(g.op.BatchNormalization(g.op.Conv(x, _w(6, 4, 1, 1)), s, _w(6), _w(6), np.ones(6, np.float32)))
    assert run_pass(g, conv_bn.run)[1] == 0


def test_conv_bn_folding_against_onnxruntime():
    """A Conv + BatchNormalization + Relu model from onnx.helper, optimized and run, against onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(a, n) for n, a in [("w", _w(8, 3, 3, 3)), ("b", _w(8)), ("sc", _w(8)), ("bi", _w(8)),
                                                         ("mu", _w(8)), ("var", (R.random(8) + 0.5).astype(np.float32))]]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "sc", "bi", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "cbr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = R.standard_normal((2, 3, 16, 16)).astype(np.float32)
    engine = sp.compile(model)
    assert [n.op_type for n in engine.graph.nodes] == ["Conv", "Relu"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(engine.run({"x": x})["y"], want, rtol=1e-4, atol=1e-5)
