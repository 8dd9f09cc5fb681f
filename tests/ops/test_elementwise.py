"""Elementwise math ops against ONNX's reference evaluator and numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan.ops import Trait, lookup
from _mathops_util import check, node_model, run_ours

rng = np.random.default_rng(0)
X = rng.uniform(-0.9, 0.9, (3, 4)).astype(np.float32)
POS = rng.uniform(1.1, 3.0, (3, 4)).astype(np.float32)


@pytest.mark.parametrize("op", ["Abs", "Neg", "Exp", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
                                "Cosh", "Asinh", "Atanh", "Erf", "Sign", "Floor", "Ceil", "Reciprocal"])
def test_unary_float(op):
    check(op, {"x": X})


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Acosh"])
def test_unary_positive(op):
    check(op, {"x": POS})


def test_round_is_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6], np.float32)
    (y,) = check("Round", {"x": x})
    np.testing.assert_array_equal(y, [0, 2, 2, -0, -2, 2, -3])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])
def test_abs_neg_sign_integers(dtype):
    x = np.array([0, 1, 5, 7], dtype) if np.dtype(dtype).kind == "u" else np.array([-3, 0, 2, -7], dtype)
    check("Abs", {"x": x})
    check("Sign", {"x": x})
    if np.dtype(dtype).kind == "i":
        check("Neg", {"x": x})


def test_isnan_isinf_detect_flags():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check("IsNaN", {"x": x})
    for neg, pos in [(1, 1), (0, 1), (1, 0), (0, 0)]:
        check("IsInf", {"x": x}, {"detect_negative": neg, "detect_positive": pos})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.int32, np.int64,
                                   np.uint8, np.uint16, np.uint32, np.uint64])
def test_binary_broadcast(op, dtype):
    if np.dtype(dtype).kind == "f":
        a = rng.uniform(-3, 3, (2, 3, 4)).astype(dtype)
        b = rng.uniform(0.5, 3, (3, 1)).astype(dtype)
    else:
        lo = 0 if np.dtype(dtype).kind == "u" else -20
        a = rng.integers(max(lo, 0) if op == "Sub" and lo == 0 else lo, 40, (2, 3, 4)).astype(dtype)
        b = rng.integers(1, 6, (3, 1)).astype(dtype)
        if op == "Sub" and lo == 0:
            a = a + np.asarray(10, dtype)
    check(op, {"a": a, "b": b}, rtol=1e-3 if dtype == np.float16 else 1e-6)


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    (y,) = check("Div", {"a": a, "b": b})
    np.testing.assert_array_equal(y, [3, -3, -3, 3])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.float32])
def test_mod_signs(fmod, dtype):
    if dtype == np.float32 and fmod == 0:
        a = np.array([5.5, -5.5, 5.5, -5.5], dtype)
    else:
        a = np.array([5, -5, 5, -5], dtype)
    b = np.array([3, 3, -3, -3], dtype)
    (y,) = check("Mod", {"a": a, "b": b}, {"fmod": fmod})
    want = np.fmod(a, b) if fmod else np.mod(a, b)
    np.testing.assert_allclose(y, want)


def test_mod_uint64():
    a = np.array([2**40 + 3, 17], np.uint64)
    b = np.array([7, 5], np.uint64)
    check("Mod", {"a": a, "b": b})


def test_pow_mixed_types():
    check("Pow", {"a": np.array([1.5, 2.0, 3.0], np.float32), "b": np.array([2, 3, 0], np.int64)})
    check("Pow", {"a": np.array([2, 3, 4], np.int32), "b": np.array([2, 3, 1], np.int32)})
    check("Pow", {"a": np.array([2, 3, 4], np.int64), "b": np.array([0.5, 2.0, 1.5], np.float32)})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_broadcast(op):
    ins = {"a": rng.standard_normal((2, 3)).astype(np.float32),
           "b": rng.standard_normal((3,)).astype(np.float32),
           "c": rng.standard_normal((2, 1)).astype(np.float32)}
    check(op, ins)
    check(op, {"a": ins["a"]})


def test_max_min_integers_and_nan():
    check("Max", {"a": np.array([1, 9, 3], np.uint32), "b": np.array([4, 2, 3], np.uint32)})
    check("Min", {"a": np.array([-1, 9, 3], np.int8), "b": np.array([4, -2, 3], np.int8)})
    (y,) = run_ours(node_model("Max", {"a": np.array([np.nan, 1], np.float32),
                                       "b": np.array([0, np.nan], np.float32)}),
                    {"a": np.array([np.nan, 1], np.float32), "b": np.array([0, np.nan], np.float32)})
    assert np.isnan(y).all()


def test_clip_inputs_opset13():
    x = rng.uniform(-5, 5, (3, 4)).astype(np.float32)
    check("Clip", {"x": x, "lo": np.array(-1.0, np.float32), "hi": np.array(2.0, np.float32)})
    check("Clip", {"x": x, "lo": np.array(-1.0, np.float32)})
    check("Clip", {"x": x, "lo": None, "hi": np.array(0.5, np.float32)})
    check("Clip", {"x": x})
    # min > max: everything becomes max
    check("Clip", {"x": x, "lo": np.array(3.0, np.float32), "hi": np.array(1.0, np.float32)})
    xi = np.array([-9, 0, 9, 200], np.int64)
    check("Clip", {"x": xi, "lo": np.array(-3, np.int64), "hi": np.array(5, np.int64)})
    xu = np.array([0, 9, 70000], np.uint32)
    check("Clip", {"x": xu, "lo": np.array(3, np.uint32), "hi": np.array(100, np.uint32)})


def test_clip_attributes_opset6():
    x = np.array([-3.0, -0.5, 0.5, 3.0], np.float32)
    model = node_model("Clip", {"x": x}, {"min": -1.0, "max": 1.0}, opset=6)
    (y,) = run_ours(model, {"x": x})
    np.testing.assert_array_equal(y, np.clip(x, -1, 1))


def test_legacy_broadcast_axis_opset6():
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    model = node_model("Add", {"a": a, "b": b}, {"broadcast": 1, "axis": 1}, opset=6)
    (y,) = run_ours(model, {"a": a, "b": b})
    np.testing.assert_allclose(y, a + b[None, :, :, None], rtol=1e-6)
    model = node_model("Mul", {"a": a, "b": a[0, 0, 0]}, {"broadcast": 1}, opset=6)
    (y,) = run_ours(model, {"a": a, "b": a[0, 0, 0]})
    np.testing.assert_allclose(y, a * a[0, 0, 0], rtol=1e-6)


def test_opset1_consumed_inputs_accepted():
    x = np.array([-1.0, 4.0], np.float32)
    model = node_model("Abs", {"x": x}, {"consumed_inputs": [0]}, opset=1)
    (y,) = run_ours(model, {"x": x})
    np.testing.assert_array_equal(y, [1.0, 4.0])


def test_symbolic_shapes_and_traits():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 4))
    b = g.placeholder("b", "float32", (4,))
    y = g.op.Add(x, b)
    z = g.op.Sum(y, x, b)
    c = g.op.Clip(z, np.float32(0), np.float32(1))
    s = g.op.IsNaN(c)
    assert y.shape == ("batch", 4) and z.shape == ("batch", 4) and c.shape == ("batch", 4)
    assert s.dtype.name == "bool"
    assert lookup("Add").has(Trait.ELEMENTWISE | Trait.COMMUTATIVE)
    assert lookup("Sub").has(Trait.ELEMENTWISE) and not lookup("Sub").has(Trait.COMMUTATIVE)
    assert lookup("Max").has(Trait.COMMUTATIVE)
    with pytest.raises(sp.ShapeError):
        g2 = sp.Graph()
        g2.op.Add(g2.placeholder("a", "float32", (3,)), g2.placeholder("b", "float32", (4,)))


def test_kernels_take_torch_tensors_on_input_device():
    from shapeplan.ops.elementwise import add, clip
    a = torch.arange(6).to(torch.uint32).reshape(2, 3)
    out = add(a, a)
    assert out.dtype == torch.uint32 and out.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert clip(torch.tensor([1.0, 5.0]), torch.tensor(2.0), None).tolist() == [2.0, 5.0]
