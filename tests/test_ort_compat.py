"""``shapeplan.ort``: onnxruntime's session API, checked against onnxruntime itself on the same models (its
metadata: names, type strings, shapes with symbolic and unknown dimensions; its outputs; its model
metadata), and its errors."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeplan.ort as sport
from shapeplan.errors import InputError

ort = pytest.importorskip("onnxruntime")
LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _model(path) -> str:
    """x: float[batch, 8], idx: int64[n] (n unknown: no name) -> y = relu(x @ w + b): float[batch, 4],
    z = gather(y, idx, axis=1): float[batch, ?], s = shape(x): int64[2]; metadata set."""
    rng = np.random.RandomState(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Gather", ["y", "idx"], ["z"], axis=1),
             helper.make_node("Shape", ["x"], ["s"])]
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, None)
    idx.type.tensor_type.shape.dim.add()                     # one dimension, neither a value nor a name
    g = helper.make_graph(nodes, "compat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]), idx],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "k"]),
                           helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                          [numpy_helper.from_array(rng.rand(8, 4).astype(np.float32) - 0.5, "w"),
                           numpy_helper.from_array(rng.rand(4).astype(np.float32) - 0.5, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="compat-test",
                          doc_string="a test model", model_version=3)
    helper.set_model_props(m, {"author": "shapeplan", "purpose": "tests"})
    onnx.save(m, str(path))
    return str(path)


def _args(args) -> list:
    return [(a.name, a.type, a.shape) for a in args]


def test_metadata_and_outputs_equal_onnxruntimes(tmp_path) -> None:
    path = _model(tmp_path / "m.onnx")
    ours, theirs = sport.InferenceSession(path), ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert _args(ours.get_inputs()) == _args(theirs.get_inputs())
    assert _args(ours.get_outputs()) == _args(theirs.get_outputs())
    assert ours.get_providers() == ["CPUExecutionProvider"]
    mo, mt = ours.get_modelmeta(), theirs.get_modelmeta()
    for f in ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
              "custom_metadata_map"):
        assert getattr(mo, f) == getattr(mt, f), f
    x = np.random.RandomState(1).rand(5, 8).astype(np.float32)
    feeds = {"x": x, "idx": np.array([3, 0, 3], np.int64)}
    for names in (None, [], ["z", "y"], ["s"], ["y", "y"]):
        got, want = ours.run(names, feeds), theirs.run(names, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    # feeds numpy converts, as onnxruntime takes them
    got = ours.run(["s"], {"x": x.tolist(), "idx": [1]})
    np.testing.assert_array_equal(got[0], [5, 8])


def test_bytes_pathlike_and_options(tmp_path, monkeypatch) -> None:
    import shapeplan as sp
    path = _model(tmp_path / "m.onnx")
    x = np.ones((2, 8), np.float32)
    feeds = {"x": x, "idx": np.array([1], np.int64)}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    with open(path, "rb") as f:
        data = f.read()
    for src in (data, bytearray(data), tmp_path / "m.onnx"):
        got = sport.InferenceSession(src).run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    seen = {}
    real = sp.compile

    def spy(model, **kw):
        seen.update(kw)
        return real(model, **kw)
    monkeypatch.setattr(sp, "compile", spy)
    opts = sport.SessionOptions()
    opts.graph_optimization_level = sport.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = sport.InferenceSession(path, sess_options=opts).run(None, feeds)
    assert seen["optimize"] is False and seen["device"] == "cpu"
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    sport.InferenceSession(path, sess_options=sport.SessionOptions())
    assert seen["optimize"] is True


def test_light_model_equals_onnxruntime() -> None:
    path = os.path.join(LIGHT, "light_squeezenet.onnx")
    if not os.path.exists(path):
        pytest.skip("onnx's light models are not installed")
    ours, theirs = sport.InferenceSession(path), ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert _args(ours.get_inputs()) == _args(theirs.get_inputs())
    assert _args(ours.get_outputs()) == _args(theirs.get_outputs())
    (i,) = theirs.get_inputs()
    x = np.random.RandomState(0).rand(*i.shape).astype(np.float32)
    np.testing.assert_allclose(ours.run(None, {i.name: x})[0], theirs.run(None, {i.name: x})[0], rtol=1e-4, atol=1e-5)


def test_providers_fall_back_and_errors(tmp_path) -> None:
    import torch
    path = _model(tmp_path / "m.onnx")
    s = sport.InferenceSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    if not torch.cuda.is_available():
        assert s.get_providers() == ["CPUExecutionProvider"] and sport.get_device() == "CPU"
    assert "CPUExecutionProvider" in sport.get_available_providers()
    with pytest.raises(ValueError, match="unknown provider 'OpenVINOExecutionProvider'"):
        sport.InferenceSession(path, providers=["OpenVINOExecutionProvider"])
    with pytest.raises(ValueError, match="provider options"):
        sport.InferenceSession(path, providers=[("CUDAExecutionProvider", {"device_id": 0})])
    feeds = {"x": np.ones((2, 8), np.float32), "idx": np.array([1], np.int64)}
    with pytest.raises(InputError, match=r"unknown input\(s\) \['q'\]; the model's inputs are \['x', 'idx'\]"):
        s.run(None, {**feeds, "q": 1})
    with pytest.raises(InputError, match=r"unknown output\(s\) \['nope'\]"):
        s.run(["nope"], feeds)
    with pytest.raises(InputError, match="'x'"):
        s.run(None, {**feeds, "x": np.ones((2, 8), np.float64)})
    with pytest.raises(InputError, match="'x'"):
        s.run(None, {"idx": feeds["idx"]})
    with pytest.raises(InputError, match="input_feed must be a dict"):
        s.run(None, [feeds["x"]])
