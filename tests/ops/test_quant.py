"""ops/quant.py: QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear vs the ONNX reference."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.ops._mathops_util import assert_same, check, run_ours

rng = np.random.default_rng(3)
X = rng.standard_normal((3, 4, 6)).astype(np.float32) * 20


@pytest.mark.parametrize("zp", [np.uint8(128), np.int8(-3), np.uint16(30000), np.int16(-7), None])
def test_quantize_scalar(zp):
    inputs = {"x": X, "s": np.float32(0.37)}
    if zp is not None:
        inputs["z"] = np.array(zp)
    check("QuantizeLinear", inputs)


def test_quantize_per_axis_and_blocked_roundtrip():
    s = rng.uniform(0.1, 1, 4).astype(np.float32)
    z = rng.integers(-10, 10, 4).astype(np.int8)
    (q,) = check("QuantizeLinear", {"x": X, "s": s, "z": z}, {"axis": 1})
    check("DequantizeLinear", {"q": q, "s": s, "z": z}, {"axis": 1})
    sb = rng.uniform(0.1, 1, (3, 4, 2)).astype(np.float32)     # blocks of 4 along the last axis (6 = 4 + 2)
    zb = rng.integers(0, 255, (3, 4, 2)).astype(np.uint8)
    (qb,) = check("QuantizeLinear", {"x": X, "s": sb, "z": zb}, {"axis": -1, "block_size": 4}, opset=21)
    check("DequantizeLinear", {"q": qb, "s": sb, "z": zb}, {"axis": -1, "block_size": 4}, opset=21)


@pytest.mark.parametrize("out", [onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(out, saturate):
    x = np.array([0.0, 1.3, -2.6, 1e5, -1e5, 448.1, np.inf], np.float32)
    check("QuantizeLinear", {"x": x, "s": np.float32(1.0)}, {"output_dtype": out, "saturate": saturate},
          opset=21)


def _int4_model(op: str, dtype: int) -> onnx.ModelProto:
    zp = helper.make_tensor("z", dtype, [], [1])
    node = helper.make_node(op, ["x", "s", "z"], ["y"])
    x_type = onnx.TensorProto.FLOAT if op == "QuantizeLinear" else dtype
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", x_type, [6]),
                                        helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", 0, None)], [zp])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("dtype", [onnx.TensorProto.INT4, onnx.TensorProto.UINT4])
def test_int4_quantize_dequantize(dtype):
    x = np.array([-20, -3.1, 0, 2.5, 3.5, 40], np.float32)
    feeds = {"x": x, "s": np.float32(1.0)}
    model = _int4_model("QuantizeLinear", dtype)
    ours = run_ours(model, feeds)[0]
    want = onnx.reference.ReferenceEvaluator(model).run(None, feeds)[0]
    assert_same(ours, want)
    dq = _int4_model("DequantizeLinear", dtype)
    feeds = {"x": want, "s": np.float32(0.5)}
    assert_same(run_ours(dq, feeds)[0], onnx.reference.ReferenceEvaluator(dq).run(None, feeds)[0])


def test_dequantize_float16_scale_and_output_dtype():
    q = rng.integers(0, 255, (2, 5)).astype(np.uint8)
    check("DequantizeLinear", {"q": q, "s": np.float16(0.25), "z": np.uint8(100)})
    check("DequantizeLinear", {"q": q, "s": np.float32(0.25)}, {"output_dtype": onnx.TensorProto.FLOAT16},
          opset=23)
    fp8 = numpy_helper.to_array(numpy_helper.from_array(np.array([1.5, -2, 448], np.float32)
                                                        .astype(ml_dtypes.float8_e4m3fn)))
    check("DequantizeLinear", {"q": fp8, "s": np.float32(2.0)}, opset=21)


@pytest.mark.parametrize("x", [X.reshape(-1)[:20], np.abs(X[0]), -np.abs(X[1]), np.zeros(3, np.float32)])
def test_dynamic_quantize_linear(x):
    check("DynamicQuantizeLinear", {"x": np.ascontiguousarray(x)}, outputs=3)
