"""Cast / CastLike / BitCast against ONNX's reference evaluator (which uses ml_dtypes)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from onnx import TensorProto as TP

from _mathops_util import assert_same, node_model, run_ours, run_ref

SPECIAL = np.array([0.0, -0.0, 0.3, -1.7, 2.5, 3.5, 100.0, 449.0, 465.0, 1e6, -1e6, np.inf, -np.inf, np.nan],
                   np.float32)


def cast_both(x, to, opset=None, **attrs):
    model = node_model("Cast", {"x": x}, {"to": to, **attrs}, opset=opset)
    (got,) = run_ours(model, {"x": x})
    (want,) = run_ref(model, {"x": x})
    return got, want


@pytest.mark.parametrize("to", [TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [np.float32, np.float16])
def test_float8_saturate(to, saturate, src):
    with np.errstate(over="ignore"):
        x = SPECIAL.astype(src)
    got, want = cast_both(x, to, saturate=saturate)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("to", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2, TP.FLOAT4E2M1])
def test_sub_byte_targets(to):
    x = np.array([-9.0, -8.5, -2.5, -0.6, 0.0, 0.25, 0.75, 1.25, 2.5, 5.0, 7.6, 15.2, 100.0], np.float32)
    got, want = cast_both(x, to)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_from_int4_and_float4():
    x = np.array([-8, -1, 0, 7], dtype=ml_dtypes.int4)
    got, want = cast_both(x, TP.FLOAT)
    assert_same(got, want)
    x = np.array([-6, -0.5, 0, 1.5, 6], dtype=ml_dtypes.float4_e2m1fn)
    got, want = cast_both(x, TP.FLOAT16)
    assert_same(got, want)


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8e8m0_round_modes(mode, saturate):
    x = np.array([0.0, 0.124, 0.25, 0.3, 0.75, 1.0, 1.5, 3.0, 2.0**127 * 1.5, np.inf], np.float32)
    got, want = cast_both(x, TP.FLOAT8E8M0, opset=25, saturate=saturate, round_mode=mode)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("src,to", [(np.float32, TP.BFLOAT16), (np.float64, TP.FLOAT16), (np.float32, TP.INT32),
                                    (np.float32, TP.UINT8), (np.int64, TP.FLOAT), (np.int32, TP.BOOL),
                                    (np.float32, TP.UINT32), (np.uint64, TP.INT64), (np.bool_, TP.FLOAT)])
def test_standard_casts(src, to):
    x = np.array([0, 1, 2, 3, 7, 100], src) if src != np.bool_ else np.array([True, False])
    if np.dtype(src).kind == "f":
        x = np.array([0.0, 1.7, -0.0, 2.5, 200.9, 3.49], src)
    got, want = cast_both(x, to)
    assert_same(got, want)


def test_string_casts():
    s = np.array(["1.5", "-2", "INF", "-inf", "NaN", "1e3"], dtype=object)
    got, want = cast_both(s, TP.FLOAT)
    assert_same(got, want)
    got, _ = cast_both(np.array(["12", "-7"], dtype=object), TP.INT64)
    np.testing.assert_array_equal(got, [12, -7])
    x = np.array([0.5, 3.0, -1.25], np.float32)
    got, want = cast_both(x, TP.STRING)
    assert list(got.astype(str)) == list(want.astype(str))


def test_cast_opset1_string_to():
    x = np.array([1.5, -2.5], np.float32)
    model = node_model("Cast", {"x": x}, {"to": "INT32"}, opset=1)
    (y,) = run_ours(model, {"x": x})
    assert y.dtype == np.int32 and list(y) == [1, -2]


def test_castlike_uses_declared_target_type():
    x = np.array([0.3, 17.0, 1000.0], np.float32)
    like = np.zeros((0,), dtype=ml_dtypes.float8_e4m3fn)
    model = node_model("CastLike", {"x": x, "like": like}, {"saturate": 1})
    (got,) = run_ours(model, {"x": x, "like": like})
    (want,) = run_ref(model, {"x": x, "like": like})
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
    like4 = np.zeros((0,), dtype=ml_dtypes.int4)
    model = node_model("CastLike", {"x": x, "like": like4})
    (got,) = run_ours(model, {"x": x, "like": like4})
    assert got.dtype == ml_dtypes.int4


@pytest.mark.parametrize("src,to", [(np.float32, TP.INT32), (np.int64, TP.DOUBLE), (np.uint16, TP.INT16),
                                    (np.bool_, TP.UINT8), (np.int8, TP.UINT8)])
def test_bitcast(src, to):
    x = np.array([1, 0, 3, 1], src) if src != np.float32 else np.array([1.0, -2.5, 0.0, 3e-3], src)
    model = node_model("BitCast", {"x": x}, {"to": to}, opset=26)
    (got,) = run_ours(model, {"x": x})
    from onnx.helper import tensor_dtype_to_np_dtype
    np.testing.assert_array_equal(got, x.view(tensor_dtype_to_np_dtype(to)))


def test_cast_kernel_keeps_device_and_shape():
    from shapeplan.ir.dtypes import dtype
    from shapeplan.ops.cast import cast_tensor
    t = torch.tensor([[1.2, 500.0]])
    y = cast_tensor(t, dtype("float8e4m3fn"), saturate=1)
    assert y.shape == t.shape and y.device == t.device and y.float().tolist() == [[1.25, 448.0]]
