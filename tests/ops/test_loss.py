"""NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss against the ONNX reference and torch.nn."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _mathops_util import check, node_model, run_ours

rng = np.random.default_rng(6)


def _inputs(shape=(3, 5, 2), weighted=False, ignore=None):
    x = rng.standard_normal(shape).astype(np.float32)
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
    if ignore is not None:
        t.flat[0] = ignore
    w = rng.uniform(0.2, 1.0, shape[1]).astype(np.float32) if weighted else None
    return x, t, w


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1])
def test_against_reference(op, reduction, weighted, ignore):
    x, t, w = _inputs(weighted=weighted, ignore=ignore)
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    check(op, {"x": x, "t": t, "w": w}, attrs, rtol=1e-5, atol=1e-6)


def test_sce_log_prob_output_and_nd():
    x, t, w = _inputs(shape=(2, 4, 3, 2))
    check("SoftmaxCrossEntropyLoss", {"x": x, "t": t}, {"reduction": "mean"}, outputs=2, rtol=1e-5)


def test_matches_torch_cross_entropy():
    x, t, w = _inputs(shape=(4, 6), weighted=True, ignore=2)
    model = node_model("SoftmaxCrossEntropyLoss", {"x": x, "t": t, "w": w},
                       {"reduction": "mean", "ignore_index": 2})
    (y,) = run_ours(model, {"x": x, "t": t, "w": w})
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(t),
                                             weight=torch.from_numpy(w), ignore_index=2)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5)
