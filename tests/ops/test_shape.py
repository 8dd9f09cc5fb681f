"""ops/shape.py: Shape/Size/Constant/ConstantOfShape/Range/EyeLike/OneHot vs the ONNX reference."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import shapeplan as sp
from shapeplan.ops.registry import Trait, lookup
from tests.ops._mathops_util import assert_same, check, node_model, run_ours

X = np.zeros((2, 3, 4, 5), np.float32)


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -3, "end": 3},
                                   {"start": 3, "end": 1}, {"start": -10, "end": 10}])
def test_shape_start_end(attrs):
    check("Shape", {"x": X}, attrs, opset=21)


def test_size():
    check("Size", {"x": X})
    check("Size", {"x": np.zeros((0, 3), np.int32)})


@pytest.mark.parametrize("attr", [
    {"value": helper.make_tensor("v", onnx.TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])},
    {"value_float": 1.5}, {"value_floats": [1.0, 2.0]}, {"value_int": 7}, {"value_ints": [1, 2, 3]},
    {"value_string": "hi"}, {"value_strings": ["a", "bc"]},
])
def test_constant_attribute_forms(attr):
    node = helper.make_node("Constant", [], ["y"], **attr)
    g = helper.make_graph([node], "t", [], [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    ours = run_ours(model, {})[0]
    want = onnx.reference.ReferenceEvaluator(model).run(None, {})[0]
    assert_same(ours, want)


def test_constant_of_shape_and_traits():
    value = helper.make_tensor("v", onnx.TensorProto.INT32, [1], [3])
    check("ConstantOfShape", {"s": np.array([2, 3], np.int64)}, {"value": value})
    check("ConstantOfShape", {"s": np.array([0], np.int64)})
    assert lookup("ConstantOfShape").has(Trait.CREATES_VALUE | Trait.VALUE_DEPENDENT_SHAPE)
    assert lookup("Shape").has(Trait.SHAPE_ONLY_OUTPUT) and lookup("Size").has(Trait.SHAPE_ONLY_OUTPUT)
    assert lookup("Range").has(Trait.CREATES_VALUE) and lookup("EyeLike").has(Trait.CREATES_VALUE)


@pytest.mark.parametrize("start,limit,delta,dtype", [(0, 10, 3, np.int64), (10, 4, -2, np.int32),
                                                     (1.0, 2.0, 0.25, np.float32), (5, 5, 1, np.int64),
                                                     (0.5, -1.0, -0.3, np.float64)])
def test_range(start, limit, delta, dtype):
    check("Range", {"a": np.array(start, dtype), "b": np.array(limit, dtype), "c": np.array(delta, dtype)})


@pytest.mark.parametrize("k,dtype", [(0, None), (1, onnx.TensorProto.INT32), (-2, onnx.TensorProto.DOUBLE)])
def test_eyelike(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", {"x": np.zeros((3, 5), np.float32)}, attrs)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis):
    idx = np.array([[0, 3, -1], [5, 2, -4]], np.int64)
    check("OneHot", {"i": idx, "d": np.array(4, np.int64), "v": np.array([-1.0, 2.0], np.float32)},
          {"axis": axis})


def test_shape_of_symbolic_input_is_inferred():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 3, 4))
    s = g.op.Shape(x, start=1)
    assert s.shape == (2,) and s.dtype.name == "int64"
    r = g.op.Range(np.array(0, np.int64), np.array(10, np.int64), np.array(3, np.int64))
    assert r.shape == (4,)
    c = g.op.ConstantOfShape(np.array([2, 5], np.int64))
    assert c.shape == (2, 5) and c.dtype.name == "float32"
    model = node_model("Shape", {"x": X})
    assert run_ours(model, {"x": X})[0].tolist() == [2, 3, 4, 5]
