"""ai.onnx.preview.training optimizers against the ONNX reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest

from _mathops_util import check, node_model, run_ours, run_ref

D = "ai.onnx.preview.training"
rng = np.random.default_rng(7)


def _tensors(n, k):
    return {f"{p}{i}": rng.standard_normal((3,)).astype(np.float32) for p in "xgvh"[:k] for i in range(n)}


def _ordered(n, k):
    t = _tensors(n, k)
    return {p + str(i): t[p + str(i)] for p in "xgvh"[:k] for i in range(n)}


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("step", [0, 3])
def test_adagrad(n, step):
    ins = {"r": np.array(0.1, np.float32), "t": np.array(step, np.int64), **_ordered(n, 3)}
    ins.update({f"v{i}": np.abs(ins[f"v{i}"]) for i in range(n)})        # accumulated squares >= 0
    check("Adagrad", ins, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01},
          outputs=2 * n, domain=D, rtol=1e-5)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("step", [0, 2])
def test_momentum(mode, step):
    ins = {"r": np.array(0.1, np.float32), "t": np.array(step, np.int64), **_ordered(2, 3)}
    check("Momentum", ins, {"alpha": 0.9, "beta": 0.5, "mode": mode, "norm_coefficient": 0.02},
          outputs=4, domain=D, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("step", [0, 4])
def test_adam(n, step):
    ins = {"r": np.array(0.1, np.float32), "t": np.array(step, np.int64), **_ordered(n, 4)}
    ins.update({f"h{i}": np.abs(ins[f"h{i}"]) for i in range(n)})
    model = node_model("Adam", ins, {"alpha": 0.9, "beta": 0.99, "epsilon": 1e-3, "norm_coefficient": 0.01,
                                     "norm_coefficient_post": 0.02}, outputs=3 * n, domain=D)
    # (the reference returns float64 for a single tensor, float32 for several: the spec says T3 = input's)
    for got, want in zip(run_ours(model, ins), run_ref(model, ins)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
