"""The real models that ship with onnx (onnx/backend/test/data/light/light_*.onnx) match their stored
outputs and ONNX Runtime on the same input, in slot_by_slot mode on CPU.

The stored outputs were produced by ONNX's backend test runner from a deterministic input: for a
float input of shape S it feeds ``np.arange(prod(S)).reshape(S) / prod(S)`` as float32
(``onnx.backend.test.runner.Runner.generate_dummy_data(..., random=False)``). The tolerances are
the ones onnx's model test list gives each model (``onnx.backend.test.case.model``).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import shapeplan as sp

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

# (model name, rtol) as listed in onnx.backend.test.case.model.collect_testcases; atol is 1e-7
MODELS = [
    ("bvlc_alexnet", 1e-3),
    ("densenet121", 2e-3),
    ("inception_v1", 1e-3),
    ("inception_v2", 1e-3),
    ("resnet50", 1e-3),
    ("shufflenet", 1e-3),
    ("squeezenet", 1e-3),
    ("vgg19", 1e-3),
    ("zfnet512", 1e-3),
]
ATOL = 1e-7


def dummy_input(vi: onnx.ValueInfoProto) -> np.ndarray:
    """The backend runner's deterministic input (generate_dummy_data with random=False)."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def load_case(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not shipped with this onnx build")
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    feeds = {vi.name: dummy_input(vi) for vi in model.graph.input if vi.name not in inits}
    t = onnx.TensorProto()
    with open(os.path.join(LIGHT, f"light_{name}_output_0.pb"), "rb") as f:
        t.ParseFromString(f.read())
    return model, feeds, onnx.numpy_helper.to_array(t)


@pytest.mark.parametrize("name,rtol", MODELS, ids=[m for m, _ in MODELS])
def test_light_model_matches_stored_output_and_onnxruntime(name: str, rtol: float) -> None:
    model, feeds, stored = load_case(name)
    engine = sp.compile(model, device="cpu", mode="slot_by_slot")
    (out,) = engine.run(feeds).values()
    assert out.shape == stored.shape and out.dtype == stored.dtype
    np.testing.assert_allclose(out, stored, rtol=rtol, atol=ATOL, err_msg=f"{name} vs stored output")

    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (ref,) = sess.run(None, feeds)
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=ATOL, err_msg=f"{name} vs onnxruntime")


def test_dummy_input_is_deterministic_ramp() -> None:
    vi = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, "n"])
    x = dummy_input(vi)
    assert x.shape == (1, 2, 1) and x.dtype == np.float32
    np.testing.assert_array_equal(x.reshape(-1), [0.0, 0.5])
