"""Conv family (ops/nn.py) against onnxruntime and ONNX's reference evaluator."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp

RNG = np.random.default_rng(0)


def single_node_model(op: str, inputs: dict[str, np.ndarray | None], n_out: int = 1, opset: int = 22,
                      out_types: list[int] | None = None, **attrs) -> onnx.ModelProto:
    names = [n if v is not None else "" for n, v in inputs.items()]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items() if v is not None]
    first = next(v for v in inputs.values() if v is not None)
    types = out_types or [helper.np_dtype_to_tensor_dtype(first.dtype)] * n_out
    graph = helper.make_graph([node], "t", ins, [helper.make_tensor_value_info(o, t, None)
                                                  for o, t in zip(outs, types)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray], ref: str = "ort") -> tuple[list, list]:
    ours = list(sp.compile(model, mode="slot_by_slot").run(feeds).values())
    if ref == "ort":
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        theirs = ReferenceEvaluator(model).run(None, feeds)
    return ours, theirs


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], ref: str = "ort", rtol: float = 1e-4,
          atol: float = 1e-5) -> None:
    ours, theirs = run_all(model, feeds, ref)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape, (a.shape, b.shape)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("attrs", [
    dict(pads=[1, 0, 2, 1], strides=[2, 1]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER", strides=[2, 3]),
    dict(auto_pad="VALID", dilations=[2, 2]),
    dict(pads=[1, 1, 1, 1], group=2),
], ids=["asym-pads", "same-upper", "same-lower", "valid-dil", "groups"])
def test_conv2d_matches_ort(attrs: dict) -> None:
    group = attrs.get("group", 1)
    feeds = {"x": f32(2, 4, 9, 8), "w": f32(6, 4 // group, 3, 3), "b": f32(6)}
    check(single_node_model("Conv", feeds, **attrs), feeds)


@pytest.mark.parametrize("rank", [1, 3])
def test_conv_1d_3d(rank: int) -> None:
    sp_in, k = [7] * rank, [3] * rank
    feeds = {"x": f32(1, 2, *sp_in), "w": f32(3, 2, *k)}
    check(single_node_model("Conv", feeds, pads=[1] * rank + [0] * rank, strides=[2] * rank), feeds)


def test_conv_symbolic_shape_inference() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 3, 32, 30))
    w = g.constant(np.zeros((8, 3, 3, 3), np.float32))
    y = g.op.Conv(x, w, pads=[1, 1, 1, 1], strides=[2, 2])
    node = y.producer
    from shapeplan.ir.shape_inference import infer_node
    infer_node(node, 21)
    assert y.shape == ("batch", 8, 16, 15)


@pytest.mark.parametrize("attrs", [
    dict(strides=[2, 2]),
    dict(strides=[3, 2], output_padding=[1, 1]),
    dict(strides=[2, 2], output_shape=[10, 9]),
    dict(strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(strides=[2, 1], pads=[1, 0, 0, 2], dilations=[2, 1]),
    dict(group=2, strides=[1, 2]),
], ids=["plain", "output-padding", "output-shape", "same-upper", "pads-dil", "groups"])
def test_conv_transpose_matches_ort(attrs: dict) -> None:
    g = attrs.get("group", 1)
    feeds = {"x": f32(2, 4, 5, 4), "w": f32(4, 6 // g, 3, 3), "b": f32(6)}
    check(single_node_model("ConvTranspose", feeds, **attrs), feeds)


def test_conv_integer_matches_ort() -> None:
    feeds = {"x": RNG.integers(0, 255, (1, 2, 6, 6), dtype=np.uint8),
             "w": RNG.integers(0, 255, (3, 2, 3, 3), dtype=np.uint8),
             "xz": np.array(7, np.uint8), "wz": np.array(3, np.uint8)}
    model = single_node_model("ConvInteger", feeds, opset=10, out_types=[onnx.TensorProto.INT32], pads=[1, 0, 1, 2])
    check(model, feeds)


def test_qlinear_conv_per_channel_matches_ort() -> None:
    feeds = {"x": RNG.integers(0, 255, (1, 3, 7, 7), dtype=np.uint8), "xs": np.array(0.02, np.float32),
             "xz": np.array(128, np.uint8), "w": RNG.integers(-60, 60, (4, 3, 3, 3), dtype=np.int8),
             "ws": np.array([0.01, 0.02, 0.015, 0.03], np.float32), "wz": np.zeros(4, np.int8),
             "ys": np.array(0.05, np.float32), "yz": np.array(100, np.uint8),
             "b": RNG.integers(-100, 100, (4,), dtype=np.int32)}
    model = single_node_model("QLinearConv", feeds, opset=10, out_types=[onnx.TensorProto.UINT8], pads=[1, 1, 1, 1])
    ours, theirs = run_all(model, feeds)
    assert ours[0].dtype == np.uint8
    assert np.abs(ours[0].astype(int) - theirs[0].astype(int)).max() <= 1    # rounding ties may differ by 1


def test_deform_conv_matches_reference_and_reduces_to_conv() -> None:
    x, w, b = f32(1, 4, 6, 5), f32(6, 2, 3, 3), f32(6)
    oh, ow = 6, 5
    offset = (RNG.standard_normal((1, 2 * 2 * 9, oh, ow)) * 0.7).astype(np.float32)
    mask = RNG.random((1, 2 * 9, oh, ow)).astype(np.float32)
    feeds = {"x": x, "w": w, "offset": offset, "b": b, "mask": mask}
    model = single_node_model("DeformConv", feeds, opset=19, group=2, offset_group=2, pads=[1, 1, 1, 1])
    check(model, feeds, ref="reference")
    # zero offsets and a unit mask: DeformConv is a plain Conv
    feeds0 = {"x": x, "w": w, "offset": np.zeros_like(offset), "b": b, "mask": np.ones_like(mask)}
    (ours,) = sp.compile(model, mode="slot_by_slot").run(feeds0).values()
    conv = single_node_model("Conv", {"x": x, "w": w, "b": b}, group=2, pads=[1, 1, 1, 1])
    (want,) = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "w": w, "b": b})
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-5)


def test_lrn_matches_ort() -> None:
    # (onnx's reference LRN loops over the batch axis instead of channels, so ORT is the reference)
    feeds = {"x": f32(2, 7, 4, 3)}
    check(single_node_model("LRN", feeds, opset=13, size=3, alpha=0.01, beta=0.6, bias=1.5), feeds)


def test_lrn_even_size_follows_spec_window() -> None:
    # ORT only takes odd sizes; the spec's window is [c - floor((s-1)/2), c + ceil((s-1)/2)]
    x, size, alpha, beta, bias = f32(1, 6, 2, 2), 4, 0.02, 0.75, 1.0
    sq = np.zeros_like(x)
    for c in range(6):
        lo, hi = max(0, c - 1), min(5, c + 2)
        sq[:, c] = (x[:, lo:hi + 1] ** 2).sum(1)
    want = x / (bias + alpha / size * sq) ** beta
    (got,) = sp.compile(single_node_model("LRN", {"x": x}, opset=13, size=size, alpha=alpha, beta=beta,
                                          bias=bias), mode="slot_by_slot").run({"x": x}).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
