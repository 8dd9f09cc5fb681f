"""The real models that ship with onnx (onnx/backend/test/data/light/light_*.onnx) match their stored
outputs and ONNX Runtime on the same input, in slot_by_slot mode on CPU.

The stored outputs were produced by ONNX's backend test runner from a deterministic input: for a
float input of shape S it feeds ``np.arange(prod(S)).reshape(S) / prod(S)`` as float32
(``onnx.backend.test.runner.Runner.generate_dummy_data(..., random=False)``). The tolerances are
the ones onnx's model test list gives each model (``onnx.backend.test.case.model``).

The "light" models build every weight with ConstantOfShape (one value per tensor), so their final
outputs are nearly uniform (softmax of equal logits) and would hide most bugs. The test therefore
also exposes a few spatial feature maps spread through each network as extra outputs and checks
those against ONNX Runtime too.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import shapeplan as sp

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

# (model name, rtol) as listed in onnx.backend.test.case.model.collect_testcases; atol is 1e-7.
# The two slowest (~20 s each on 2 cores) run only with -m slow.
SLOW = {"densenet121", "vgg19"}
MODELS = [
    pytest.param(name, rtol, id=name, marks=[pytest.mark.slow] if name in SLOW else [])
    for name, rtol in [("bvlc_alexnet", 1e-3), ("densenet121", 2e-3), ("inception_v1", 1e-3),
                       ("inception_v2", 1e-3), ("resnet50", 1e-3), ("shufflenet", 1e-3),
                       ("squeezenet", 1e-3), ("vgg19", 1e-3), ("zfnet512", 1e-3)]
]
ATOL = 1e-7
N_PROBES = 5


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


def with_probes(model: onnx.ModelProto, n: int = N_PROBES) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs ``n`` spatial feature maps spread through the network."""
    inferred = onnx.shape_inference.infer_shapes(model)
    order = {o: i for i, node in enumerate(model.graph.node) if node.op_type != "ConstantOfShape"
             for o in node.output}
    maps = sorted((vi for vi in inferred.graph.value_info if vi.name in order
                   and len(vi.type.tensor_type.shape.dim) == 4 and vi.type.tensor_type.shape.dim[2].dim_value > 1),
                  key=lambda vi: order[vi.name])
    probed = onnx.ModelProto()
    probed.CopyFrom(model)
    probed.graph.output.extend(maps[int(i)] for i in np.unique(np.linspace(0, len(maps) - 1, n).astype(int)))
    return probed


@pytest.mark.parametrize("name,rtol", MODELS)
def test_light_model_matches_stored_output_and_onnxruntime(name: str, rtol: float) -> None:
    model, feeds, stored = load_case(name)
    model = with_probes(model)
    engine = sp.compile(model, device="cpu", mode="slot_by_slot")
    outs = list(engine.run(feeds).values())
    out = outs[0]
    assert out.shape == stored.shape and out.dtype == stored.dtype
    np.testing.assert_allclose(out, stored, rtol=rtol, atol=ATOL, err_msg=f"{name} vs stored output")

    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = sess.run(None, feeds)
    assert len(outs) == len(refs) > 1
    np.testing.assert_allclose(out, refs[0], rtol=rtol, atol=ATOL, err_msg=f"{name} vs onnxruntime")
    for vi, got, want in zip(model.graph.output[1:], outs[1:], refs[1:]):
        assert got.shape == want.shape, vi.name
        assert np.unique(want).size > 1, f"{name}: probe {vi.name} is constant, it checks nothing"
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6 * scale,
                                   err_msg=f"{name}: feature map {vi.name} vs onnxruntime")


def test_dummy_input_is_deterministic_ramp() -> None:
    vi = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, "n"])
    x = dummy_input(vi)
    assert x.shape == (1, 2, 1) and x.dtype == np.float32
    np.testing.assert_array_equal(x.reshape(-1), [0.0, 0.5])
