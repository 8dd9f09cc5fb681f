"""CausalConvWithState (ops/misc.py): prefill == step-by-step decode with the carried state."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import shapeplan as sp

F = onnx.TensorProto.FLOAT


def causal_model(L: int, activation: str = "none") -> onnx.ModelProto:
    node = helper.make_node("CausalConvWithState", ["x", "w", "b", "past"], ["y", "present"], activation=activation)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", F, [2, 3, L]),
                                        helper.make_tensor_value_info("w", F, [3, 1, 4]),
                                        helper.make_tensor_value_info("b", F, [3]),
                                        helper.make_tensor_value_info("past", F, [2, 3, 3])],
                          [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("present", F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 27)])


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, past: np.ndarray, silu: bool) -> tuple:
    full = np.concatenate([past, x], -1)
    k = w.shape[-1]
    y = np.stack([(full[:, :, t:t + k] * w[:, 0]).sum(-1) for t in range(x.shape[-1])], -1) + b[:, None]
    if silu:
        y = y / (1 + np.exp(-y))
    return y, full[:, :, -(k - 1):]


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_prefill_matches_reference_and_decode_steps(activation: str) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    w = rng.standard_normal((3, 1, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    past = rng.standard_normal((2, 3, 3)).astype(np.float32)
    y, present = sp.compile(causal_model(6, activation), mode="slot_by_slot").run(
        {"x": x, "w": w, "b": b, "past": past}).values()
    want_y, want_present = reference(x, w, b, past, activation == "silu")
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(present, want_present)
    step = sp.compile(causal_model(1, activation), mode="slot_by_slot")
    state = past
    for t in range(6):
        yt, state = step.run({"x": x[:, :, t:t + 1], "w": w, "b": b, "past": state}).values()
        np.testing.assert_allclose(yt[:, :, 0], want_y[:, :, t], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_present)
