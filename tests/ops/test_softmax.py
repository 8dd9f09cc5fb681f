"""Softmax / LogSoftmax / Hardmax: opset < 13 coerces to 2-D, opset 13 works along one axis."""
from __future__ import annotations

import numpy as np
import pytest

from _mathops_util import check, node_model, run_ours

rng = np.random.default_rng(5)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)


def _np_2d(op, x, axis):
    """numpy reference of the opset < 13 definition (the reference evaluator only has opset 13)."""
    axis = axis % x.ndim
    m = x.reshape(int(np.prod(x.shape[:axis])), -1)
    e = np.exp(m - m.max(1, keepdims=True))
    if op == "Softmax":
        y = e / e.sum(1, keepdims=True)
    elif op == "LogSoftmax":
        y = np.log(e / e.sum(1, keepdims=True))
    else:
        y = np.zeros_like(m)
        y[np.arange(len(m)), m.argmax(1)] = 1
    return y.reshape(x.shape)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_opset13_along_axis(op, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op, {"x": X}, attrs, opset=13, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_opset11_coerces_to_2d(op, axis):
    attrs = {} if axis is None else {"axis": axis}
    (y,) = run_ours(node_model(op, {"x": X}, attrs, opset=11), {"x": X})
    np.testing.assert_allclose(y, _np_2d(op, X, 1 if axis is None else axis), rtol=1e-5, atol=1e-6)


def test_opset11_differs_from_opset13():
    (a,) = run_ours(node_model("Softmax", {"x": X}, {"axis": 1}, opset=11), {"x": X})
    (b,) = check("Softmax", {"x": X}, {"axis": 1}, opset=13)
    np.testing.assert_allclose(a.reshape(2, 12).sum(1), 1, rtol=1e-6)      # over dims 1..2
    np.testing.assert_allclose(b.sum(1), 1, rtol=1e-6)                     # over dim 1 only
    assert not np.allclose(a, b)


def test_large_values_are_stable_and_float16():
    x = np.array([[1000.0, 1001.0, 1002.0]], np.float32)
    check("Softmax", {"x": x})
    check("LogSoftmax", {"x": x})
    check("Softmax", {"x": X.astype(np.float16)}, rtol=2e-3, atol=1e-3)


def test_hardmax_ties_pick_first():
    x = np.array([[1.0, 3.0, 3.0, 0.0]], np.float32)
    (y,) = check("Hardmax", {"x": x})
    np.testing.assert_array_equal(y, [[0, 1, 0, 0]])
