"""Comparison, logical, bitwise and BitShift ops against numpy and ONNX's reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest

import shapeplan as sp
from _mathops_util import check, node_model, run_ours

rng = np.random.default_rng(2)


@pytest.mark.parametrize("op", ["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.uint8, np.uint16, np.uint32, np.uint64])
def test_comparisons_broadcast(op, dtype):
    a = rng.integers(0, 5, (2, 3, 4)).astype(dtype)
    b = rng.integers(0, 5, (3, 1)).astype(dtype)
    (y,) = check(op, {"a": a, "b": b})
    assert y.dtype == np.bool_


def test_uint64_compare_large_values():
    a = np.array([2**63 - 1, 5], np.uint64)
    b = np.array([3, 5], np.uint64)
    check("Greater", {"a": a, "b": b})


def test_equal_strings():
    a = np.array(["a", "bc", "d"], dtype=object)
    b = np.array(["a", "b", "d"], dtype=object)
    model = node_model("Equal", {"a": a, "b": b}, opset=19)
    (y,) = run_ours(model, {"a": a, "b": b})
    np.testing.assert_array_equal(y, [True, False, True])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    a = rng.integers(0, 2, (3, 4)).astype(bool)
    b = rng.integers(0, 2, (4,)).astype(bool)
    check(op, {"a": a, "b": b})


def test_not():
    check("Not", {"x": np.array([True, False])})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    check(op, {"a": a, "b": b})
    check("BitwiseNot", {"x": a})


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_unsigned(dtype, direction):
    bits = np.iinfo(dtype).bits
    x = np.array([1, 7, np.iinfo(dtype).max, 2 ** (bits - 1)], dtype)
    y = np.array([1, 2, 3, bits - 1], dtype)
    (out,) = check("BitShift", {"x": x, "y": y}, {"direction": direction}, opset=11)
    want = np.left_shift(x, y) if direction == "LEFT" else np.right_shift(x, y)
    np.testing.assert_array_equal(out, want)


def test_bitshift_out_of_range_and_signed_opset28():
    x = np.array([-8, 8, -1, 5], np.int32)
    y = np.array([1, 40, 33, -1], np.int32)
    model = node_model("BitShift", {"x": x, "y": y}, {"direction": "RIGHT"}, opset=28)
    (out,) = run_ours(model, {"x": x, "y": y})
    np.testing.assert_array_equal(out, [-4, 0, -1, 0])
    model = node_model("BitShift", {"x": x, "y": y}, {"direction": "LEFT"}, opset=28)
    (out,) = run_ours(model, {"x": x, "y": y})
    np.testing.assert_array_equal(out, [-16, 0, 0, 0])


def test_comparison_shape_is_symbolic_bool():
    g = sp.Graph()
    a = g.placeholder("a", "float32", ("n", 1))
    b = g.placeholder("b", "float32", (1, "m"))
    y = g.op.Less(a, b)
    assert y.shape == ("n", "m") and y.dtype.name == "bool"
