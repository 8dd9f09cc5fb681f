"""Reductions, ArgMax/ArgMin and cumulative ops against ONNX's reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest

import shapeplan as sp
from shapeplan.ops import Trait, lookup
from _mathops_util import check, node_model, run_ours

rng = np.random.default_rng(3)
X = rng.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
       "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_axes_as_input_opset18(op, keepdims):
    check(op, {"x": X, "axes": np.array([0, -1], np.int64)}, {"keepdims": keepdims}, opset=18, rtol=1e-5)
    check(op, {"x": X}, {"keepdims": keepdims}, opset=18, rtol=1e-5)            # no axes: all
    assert lookup(op, opset=18).has(Trait.REDUCTION)


@pytest.mark.parametrize("op", OPS)
def test_axes_attribute_opset11(op):
    check(op, {"x": X}, {"axes": [1], "keepdims": 0}, opset=11, rtol=1e-5)


@pytest.mark.parametrize("op", OPS)
def test_noop_with_empty_axes(op):
    check(op, {"x": X, "axes": np.array([], np.int64)}, {"noop_with_empty_axes": 1}, opset=18, rtol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_empty_set(op):
    x = np.zeros((2, 0, 4), np.float32)
    check(op, {"x": x, "axes": np.array([1], np.int64)}, {"keepdims": 1}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean", "ReduceL1"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.uint32])
def test_integer_reductions(op, dtype):
    x = rng.integers(0, 9, (3, 4)).astype(dtype)
    check(op, {"x": x, "axes": np.array([1], np.int64)}, opset=18)


def test_integer_sum_square_keeps_dtype():
    # the spec says T -> T; the reference evaluator's np.sum widens int32 to int64, so check by hand
    x = rng.integers(0, 9, (3, 4)).astype(np.int32)
    model = node_model("ReduceSumSquare", {"x": x, "axes": np.array([1], np.int64)}, opset=18)
    (y,) = run_ours(model, {"x": x, "axes": np.array([1], np.int64)})
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, (x.astype(np.int64) ** 2).sum(1, keepdims=True))


def test_reduce_max_bool_opset20():
    x = np.array([[True, False], [False, False]])
    check("ReduceMax", {"x": x, "axes": np.array([1], np.int64)}, opset=20)
    check("ReduceMin", {"x": x, "axes": np.array([0], np.int64)}, opset=20)


def test_reduce_sum_opset13_axes_input():
    check("ReduceSum", {"x": X, "axes": np.array([1], np.int64)}, {"keepdims": 0}, opset=13)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis,keepdims", [(0, 1), (-1, 0), (1, 1)])
def test_arg_select_last_index(op, last, axis, keepdims):
    x = rng.integers(0, 3, (3, 4, 2)).astype(np.float32)             # many ties
    (y,) = check(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last})
    assert y.dtype == np.int64


def test_arg_uint32():
    check("ArgMax", {"x": np.array([[1, 70000, 3]], np.uint32)}, {"axis": 1})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_cumsum(exclusive, reverse, dtype):
    x = rng.integers(-5, 5, (3, 4)).astype(dtype)
    check("CumSum", {"x": x, "axis": np.array(1, np.int32)}, {"exclusive": exclusive, "reverse": reverse})
    check("CumSum", {"x": x, "axis": np.array(-2, np.int64)}, {"exclusive": exclusive, "reverse": reverse})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod(exclusive, reverse):
    x = rng.uniform(0.5, 2, (3, 4)).astype(np.float32)
    check("CumProd", {"x": x, "axis": np.array(0, np.int64)}, {"exclusive": exclusive, "reverse": reverse},
          opset=26)


def test_symbolic_reduce_shapes():
    g = sp.Graph(opset=18)
    x = g.placeholder("x", "float32", ("batch", "seq", 8))
    assert g.op.ReduceMean(x, np.array([-1], np.int64)).shape == ("batch", "seq", 1)
    assert g.op.ReduceSum(x, np.array([1], np.int64), keepdims=0).shape == ("batch", 8)
    assert g.op.ReduceMax(x, keepdims=0).shape == ()
    assert g.op.ArgMax(x, axis=1, keepdims=0).shape == ("batch", 8)
    assert g.op.ArgMax(x, axis=1).dtype.name == "int64"
    assert g.op.CumSum(x, np.array(1, np.int64)).shape == ("batch", "seq", 8)
    with pytest.raises(sp.ShapeError):
        g.op.ReduceSum(x, np.array([3], np.int64))


def _hard_rows(n: int, dtype, seed: int):
    """Rows of length n: random, many ties, NaNs, all equal."""
    import torch
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, n, generator=g)
    x[1] = (x[1] * 2).round()                      # ties everywhere
    x[2, torch.randint(0, n, (3,), generator=g)] = float("nan")
    x[3] = 1.0                                     # every entry tied
    x[4, -1] = 100.0                               # the extreme in the last block
    return x.to(dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n", [32768, 128256, 65536 + 128])
def test_two_stage_argmax_equals_torch(dtype, n):
    """The two-stage ArgMax/ArgMin that CUDA uses over long last axes (e.g. a vocabulary) gives
    torch's answer: first index of the extreme on ties, first NaN when there is one."""
    import torch

    from shapeplan.ops.reduce import _two_stage_block, arg_two_stage
    x = _hard_rows(n, getattr(torch, dtype), n)
    assert _two_stage_block(x) > 0
    for largest, f in ((True, torch.argmax), (False, torch.argmin)):
        for keepdim in (True, False):
            assert torch.equal(arg_two_stage(x, keepdim, largest), f(x, -1, keepdim=keepdim))


def test_two_stage_argmax_is_only_for_long_float_rows():
    import torch

    from shapeplan.ops.reduce import _two_stage_block
    assert _two_stage_block(torch.zeros(2, 1000)) == 0                      # short: one stage
    assert _two_stage_block(torch.zeros(2, 32768, dtype=torch.int64)) == 0  # integers: one stage
    assert _two_stage_block(torch.zeros(2, 32771)) == 0                     # no block divides it
