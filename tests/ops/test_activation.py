"""Activation ops against ONNX's reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from shapeplan.ops import Trait, lookup
from _mathops_util import check, node_model, run_ours

rng = np.random.default_rng(1)
X = rng.uniform(-4, 4, (2, 3, 5)).astype(np.float32)

CASES = [
    ("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.3}),
    ("Elu", {}), ("Elu", {"alpha": 2.0}), ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 3.0}),
    ("Celu", {}), ("Celu", {"alpha": 2.0}), ("ThresholdedRelu", {}), ("ThresholdedRelu", {"alpha": 2.0}),
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.5, "beta": 0.6}), ("HardSwish", {}),
    ("Softplus", {}), ("Softsign", {}), ("Mish", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
    ("Shrink", {}), ("Shrink", {"bias": 1.5, "lambd": 1.5}),
]


@pytest.mark.parametrize("op,attrs", CASES, ids=[f"{o}-{a}" for o, a in CASES])
def test_activation_float32(op, attrs):
    check(op, {"x": X}, attrs, rtol=1e-5, atol=1e-6)
    assert lookup(op).has(Trait.ELEMENTWISE)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Elu", "Softplus", "Gelu", "HardSwish"])
def test_activation_float16(op):
    x = X.astype(np.float16)
    check(op, {"x": x}, rtol=2e-3, atol=2e-3)


def test_softplus_is_stable_for_large_inputs():
    x = np.array([-100.0, 0.0, 100.0, 1000.0], np.float32)
    (y,) = run_ours(node_model("Softplus", {"x": x}), {"x": x})
    np.testing.assert_allclose(y, [0.0, np.log(2.0), 100.0, 1000.0], rtol=1e-6, atol=1e-30)


def test_swish_opset24():
    x = X
    (y,) = run_ours(node_model("Swish", {"x": x}, {"alpha": 1.5}, opset=24), {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-1.5 * x)), rtol=1e-5, atol=1e-6)


def test_prelu_broadcast_and_per_channel():
    slope = np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1)
    check("PRelu", {"x": X, "slope": slope})
    x4 = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    check("PRelu", {"x": x4, "slope": np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1)})


def test_relu_and_shrink_integers():
    xi = np.array([-5, -1, 0, 3], np.int8)
    check("Relu", {"x": xi})
    check("Shrink", {"x": np.array([-5, -1, 0, 3], np.int32)}, {"lambd": 1.5, "bias": 1.0})


def test_opset1_legacy_attributes():
    model = node_model("LeakyRelu", {"x": X}, {"alpha": 0.2, "consumed_inputs": [0]}, opset=1)
    (y,) = run_ours(model, {"x": X})
    np.testing.assert_allclose(y, np.where(X >= 0, X, 0.2 * X), rtol=1e-6)


def test_gelu_matches_torch():
    from shapeplan.ops.activation import gelu
    t = torch.from_numpy(X)
    assert torch.allclose(gelu(t), torch.nn.functional.gelu(t))
    assert torch.allclose(gelu(t, approximate="tanh"), torch.nn.functional.gelu(t, approximate="tanh"))
