"""Pooling (ops/pool.py) against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp
from shapeplan.ir.shape_inference import infer_node

RNG = np.random.default_rng(1)


def model_of(op: str, x: np.ndarray, n_out: int = 1, extra: dict | None = None, opset: int = 22,
             **attrs) -> onnx.ModelProto:
    extra = extra or {}
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, ["x", *extra], outs, **attrs)
    ins = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)]
    ins += [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in extra.items()]
    types = [helper.np_dtype_to_tensor_dtype(x.dtype), onnx.TensorProto.INT64][:n_out]
    g = helper.make_graph([node], "t", ins, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ours = list(sp.compile(model, mode="slot_by_slot").run(feeds).values())
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return ours


POOL_CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 3], dilations=[2, 1], strides=[1, 2]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_LOWER", strides=[2, 1]),
]
POOL_IDS = ["asym-pads", "ceil", "ceil-last-window-in-pad", "dilations", "same-upper", "same-lower"]


@pytest.mark.parametrize("attrs", POOL_CASES, ids=POOL_IDS)
def test_max_pool_with_indices(attrs: dict) -> None:
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    compare(model_of("MaxPool", x, n_out=2, **attrs), {"x": x})


@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("attrs", POOL_CASES, ids=POOL_IDS)
def test_average_pool(attrs: dict, cip: int) -> None:
    if "dilations" in attrs and cip:
        pytest.skip("same geometry as cip=0 without pads")
    x = RNG.standard_normal((1, 2, 9, 8)).astype(np.float32)
    compare(model_of("AveragePool", x, count_include_pad=cip, **attrs), {"x": x})


def test_max_pool_int_and_3d() -> None:
    x = RNG.integers(0, 255, (1, 2, 5, 6, 4), dtype=np.uint8)
    compare(model_of("MaxPool", x, kernel_shape=[2, 2, 2], strides=[2, 2, 1], pads=[0, 1, 0, 1, 0, 0]), {"x": x})


def test_max_pool_storage_order_column_major() -> None:
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    (_, idx) = sp.compile(model_of("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2], storage_order=1),
                          mode="slot_by_slot").run({"x": x}).values()
    for i in range(2):
        for j in range(2):
            win = x[0, 0, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
            r, c = np.unravel_index(win.argmax(), win.shape)
            assert idx[0, 0, i, j] == (2 * j + c) * 4 + (2 * i + r)


def test_lp_pool_and_globals() -> None:
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    compare(model_of("LpPool", x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 0, 0], p=3, opset=18), {"x": x})
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        compare(model_of(op, x), {"x": x})
    (y,) = sp.compile(model_of("GlobalLpPool", x, p=2), mode="slot_by_slot").run({"x": x}).values()
    np.testing.assert_allclose(y, np.sqrt((x ** 2).sum((2, 3), keepdims=True)), rtol=1e-5)


def test_max_unpool_inverts_max_pool() -> None:
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    pooled, idx = sp.compile(model_of("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2]),
                             mode="slot_by_slot").run({"x": x}).values()
    shape = np.array([1, 2, 7, 7], np.int64)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], "t",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, pooled.shape),
         helper.make_tensor_value_info("i", onnx.TensorProto.INT64, idx.shape),
         helper.make_tensor_value_info("s", onnx.TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 22)])
    feeds = {"x": pooled, "i": idx, "s": shape}
    (y,) = sp.compile(model, mode="slot_by_slot").run(feeds).values()
    # a larger output_shape keeps the unpooled block at the origin, as the ONNX conformance case and
    # onnx's reference evaluator do (ORT re-flattens the indices into the larger shape instead)
    np.testing.assert_array_equal(y, ReferenceEvaluator(model).run(None, feeds)[0])
    assert y.shape == (1, 2, 7, 7)
    np.testing.assert_array_equal(np.sort(y[y != 0]), np.sort(pooled.reshape(-1)))


def test_pool_shape_function_keeps_symbolic_batch() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("n", 8, 15, 15))
    node = g.add_node("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, num_outputs=2)
    infer_node(node, 21)
    assert node.outputs[0].shape == ("n", 8, 7, 7)
    assert node.outputs[1].dtype.name == "int64"
