"""Normalizations (ops/normalization.py) against onnxruntime and numpy."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import shapeplan as sp

RNG = np.random.default_rng(2)
F = onnx.TensorProto.FLOAT


def make(op: str, feeds: dict[str, np.ndarray], n_out: int = 1, opset: int = 22, **attrs) -> onnx.ModelProto:
    outs = [f"y{i}" for i in range(n_out)]
    g = helper.make_graph([helper.make_node(op, list(feeds), outs, **attrs)], "t",
                          [helper.make_tensor_value_info(k, F, v.shape) for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, F, None) for o in outs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def ours(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(sp.compile(model, mode="slot_by_slot").run(feeds).values())


def theirs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_batch_norm_inference_matches_ort() -> None:
    feeds = {"x": f32(2, 5, 4, 3), "s": f32(5), "b": f32(5), "m": f32(5), "v": RNG.random(5).astype(np.float32) + .5}
    model = make("BatchNormalization", feeds, epsilon=1e-3)
    np.testing.assert_allclose(ours(model, feeds)[0], theirs(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_batch_norm_training_mode_outputs() -> None:
    x = f32(3, 4, 5)
    feeds = {"x": x, "s": f32(4), "b": f32(4), "m": f32(4), "v": RNG.random(4).astype(np.float32) + .5}
    y, rm, rv = ours(make("BatchNormalization", feeds, n_out=3, opset=15, training_mode=1, momentum=0.8), feeds)
    mean, var = x.mean((0, 2)), x.var((0, 2))
    want = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-5) * feeds["s"][None, :, None] \
        + feeds["b"][None, :, None]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm, feeds["m"] * 0.8 + mean * 0.2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, feeds["v"] * 0.8 + var * 0.2, rtol=1e-5, atol=1e-6)


def test_batch_norm_opset6_spatial0_per_activation_params() -> None:
    x = f32(2, 3, 4)
    p = {k: RNG.random((3, 4)).astype(np.float32) + .5 for k in ("s", "b", "m", "v")}
    feeds = {"x": x, **p}
    (y,) = ours(make("BatchNormalization", feeds, opset=6, spatial=0, is_test=1), feeds)
    want = (x - p["m"]) / np.sqrt(p["v"] + 1e-5) * p["s"] + p["b"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_instance_norm_matches_ort() -> None:
    feeds = {"x": f32(2, 3, 5, 4), "s": f32(3), "b": f32(3)}
    model = make("InstanceNormalization", feeds, epsilon=1e-4)
    np.testing.assert_allclose(ours(model, feeds)[0], theirs(model, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm_opset_forms(opset: int) -> None:
    x, G = f32(2, 6, 3, 2), 3
    n_aff = G if opset == 18 else 6
    feeds = {"x": x, "s": f32(n_aff), "b": f32(n_aff)}
    (y,) = ours(make("GroupNormalization", feeds, opset=opset, num_groups=G, epsilon=1e-5), feeds)
    g = x.reshape(2, G, -1)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    s = np.repeat(feeds["s"], 6 // n_aff)[None, :, None, None]
    b = np.repeat(feeds["b"], 6 // n_aff)[None, :, None, None]
    np.testing.assert_allclose(y, norm * s + b, rtol=1e-4, atol=1e-5)


def test_mvn_and_lp_normalization() -> None:
    x = f32(2, 3, 4, 5)
    (y,) = ours(make("MeanVarianceNormalization", {"x": x}, opset=13, axes=[0, 2, 3]), {"x": x})
    m = x.mean((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(y, (x - m) / (np.sqrt(((x - m) ** 2).mean((0, 2, 3), keepdims=True)) + 1e-9),
                               rtol=1e-4, atol=1e-5)
    for p in (1, 2):
        x2 = x.copy()
        x2[0, 0, 0] = 0.0                                   # a zero vector normalizes to 0, not NaN
        (y,) = ours(make("LpNormalization", {"x": x2}, opset=22, axis=-1, p=p), {"x": x2})
        norm = np.linalg.norm(x2, ord=p, axis=-1, keepdims=True)
        np.testing.assert_allclose(y, np.where(norm == 0, 0, x2 / np.where(norm == 0, 1, norm)), rtol=1e-5)
