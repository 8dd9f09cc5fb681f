"""RNN / GRU / LSTM (ops/rnn.py) against onnxruntime (and onnx's reference evaluator for layout=1)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp

RNG = np.random.default_rng(3)
T, B, I, H = 5, 3, 4, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def build(op: str, direction: str, *, seq_lens: bool, init: bool, peep: bool = False, layout: int = 0,
          **attrs) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    D, G = (2 if direction == "bidirectional" else 1), GATES[op]
    x_shape = (T, B, I) if layout == 0 else (B, T, I)
    st_shape = (D, B, H) if layout == 0 else (B, D, H)
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32),
             "w": (RNG.standard_normal((D, G * H, I)) * .5).astype(np.float32),
             "r": (RNG.standard_normal((D, G * H, H)) * .5).astype(np.float32),
             "b": (RNG.standard_normal((D, 2 * G * H)) * .3).astype(np.float32)}
    names = ["x", "w", "r", "b", "", ""]
    if seq_lens:
        feeds["sl"] = np.array([T, 2, 4][:B], np.int32)
        names[4] = "sl"
    if init:
        feeds["h0"] = RNG.standard_normal(st_shape).astype(np.float32)
        names[5] = "h0"
    if op == "LSTM":
        names += ["", ""]
        if init:
            feeds["c0"] = RNG.standard_normal(st_shape).astype(np.float32)
            names[6] = "c0"
        if peep:
            feeds["p"] = RNG.standard_normal((D, 3 * H)).astype(np.float32)
            names[7] = "p"
    while names[-1] == "":
        names.pop()
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=H, direction=direction, layout=layout, **attrs)
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
    g = helper.make_graph([node], "t", ins, [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)]), feeds


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], ref: str = "ort") -> None:
    got = list(sp.compile(model, mode="slot_by_slot").run(feeds).values())
    if ref == "ort":
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
    for a, b in zip(got, want):
        assert a.shape == b.shape, (a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_with_sequence_lens_and_initial_state(op: str, direction: str) -> None:
    compare(*build(op, direction, seq_lens=True, init=True, peep=True))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_defaults(op: str) -> None:
    compare(*build(op, "forward", seq_lens=False, init=False))


def test_gru_linear_before_reset_bidirectional() -> None:
    compare(*build("GRU", "bidirectional", seq_lens=True, init=True, linear_before_reset=1))


def test_lstm_clip_input_forget_and_activations() -> None:
    compare(*build("LSTM", "forward", seq_lens=False, init=True, clip=0.7, input_forget=1,
                   activations=["HardSigmoid", "Tanh", "Softsign"], activation_alpha=[0.3], activation_beta=[0.4]))


def test_rnn_affine_and_leaky_relu_activations() -> None:
    compare(*build("RNN", "bidirectional", seq_lens=False, init=False, activations=["LeakyRelu", "Affine"],
                   activation_alpha=[0.2, 0.5], activation_beta=[0.1]))


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_batch_major_layout(op: str) -> None:
    # ORT's CPU kernels reject layout=1; onnx's reference evaluator implements it
    compare(*build(op, "forward", seq_lens=False, init=True, layout=1), ref="reference")
