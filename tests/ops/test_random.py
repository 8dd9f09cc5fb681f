"""ops/random.py: seeded ops match onnx.reference and repeat; unseeded ones have the right shape/dtype."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import shapeplan as sp
from shapeplan.ops.registry import Trait, lookup
from tests.ops._mathops_util import assert_same, check, node_model, run_ours

rng = np.random.default_rng(5)
X = rng.standard_normal((3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.75])
def test_training_dropout_with_seed_matches_reference(ratio):
    inputs = {"x": X, "r": np.float32(ratio), "t": np.bool_(True)}
    check("Dropout", inputs, {"seed": 3}, outputs=2)


def test_inference_dropout_is_identity_with_true_mask():
    y, mask = check("Dropout", {"x": X}, outputs=2)
    assert mask.all() and (y == X).all()
    check("Dropout", {"x": X}, {"ratio": 0.4}, outputs=2, opset=10)


def test_unseeded_training_dropout_keeps_or_scales():
    feeds = {"x": X, "r": np.float32(0.5), "t": np.bool_(True)}
    y, mask = run_ours(node_model("Dropout", feeds, outputs=2), feeds)
    assert mask.dtype == np.bool_ and y.shape == X.shape
    np.testing.assert_allclose(y, np.where(mask, X * 2, 0), rtol=1e-6)


def _nullary(op: str, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [], ["y"], **attrs)
    g = helper.make_graph([node], "t", [], [helper.make_tensor_value_info("y", 0, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)])


@pytest.mark.parametrize("op,attrs", [("RandomNormal", {"mean": 1.0, "scale": 2.0}),
                                      ("RandomUniform", {"low": -1.0, "high": 3.0})])
def test_seeded_generators_match_reference_and_repeat(op, attrs):
    model = _nullary(op, shape=[3, 4], seed=7.0, **attrs)
    eng = sp.compile(model, mode="slot_by_slot")
    a, b = eng.run({})["y"], eng.run({})["y"]
    assert_same(a, onnx.reference.ReferenceEvaluator(model).run(None, {})[0])
    np.testing.assert_array_equal(a, b)
    unseeded = sp.compile(_nullary(op, shape=[3, 4], dtype=onnx.TensorProto.DOUBLE, **attrs)).run({})["y"]
    assert unseeded.shape == (3, 4) and unseeded.dtype == np.float64


@pytest.mark.parametrize("op", ["RandomNormalLike", "RandomUniformLike", "Bernoulli"])
def test_like_ops_seeded_match_reference(op):
    x = rng.uniform(0, 1, (4, 5)).astype(np.float32)
    check(op, {"x": x}, {"seed": 11.0})
    check(op, {"x": x}, {"seed": 11.0, "dtype": onnx.TensorProto.DOUBLE})
    (y,) = run_ours(node_model(op, {"x": x}), {"x": x})
    assert y.shape == x.shape and y.dtype == np.float32


def test_multinomial_seeded_is_reproducible_and_in_range():
    logits = np.log(np.array([[0.1, 0.0001, 0.9], [0.5, 0.5, 0.0001]], np.float32))
    model = node_model("Multinomial", {"x": logits}, {"sample_size": 200, "seed": 1.0})
    a, b = run_ours(model, {"x": logits})[0], run_ours(model, {"x": logits})[0]
    np.testing.assert_array_equal(a, b)
    assert a.shape == (2, 200) and a.dtype == np.int32
    assert np.bincount(a[0], minlength=3)[2] > 150 and (a[1] == 2).sum() <= 2
    assert set(np.unique(a)) <= {0, 1, 2}


def test_random_traits():
    for op in ("Dropout", "Bernoulli", "RandomNormal", "RandomUniformLike", "Multinomial"):
        assert lookup(op).has(Trait.RANDOM)
