"""ops/index.py: gather/scatter/TopK/Unique/NonZero/Compress/NMS/RoiAlign vs the ONNX reference."""
from __future__ import annotations

import numpy as np
import pytest

import shapeplan as sp
from shapeplan.ops.registry import Trait, lookup
from tests.ops._mathops_util import check

rng = np.random.default_rng(1)
X = rng.standard_normal((3, 4, 5)).astype(np.float32)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    idx = np.array([[0, -1], [1, 2]], np.int64)
    check("Gather", {"x": X, "i": idx}, {"axis": axis})
    check("Gather", {"x": X, "i": np.array(-2, np.int64)}, {"axis": axis})


def test_gather_elements_and_nd():
    idx = rng.integers(-3, 3, size=(3, 2, 5)).astype(np.int64)
    check("GatherElements", {"x": X, "i": idx}, {"axis": 1})
    check("GatherND", {"x": X, "i": np.array([[0, 1], [2, -1]], np.int64)})
    check("GatherND", {"x": X, "i": np.array([[[1], [0]], [[3], [2]], [[0], [0]]], np.int64)},
          {"batch_dims": 1})
    check("GatherND", {"x": X, "i": np.array([[2, 3, 4]], np.int64)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    idx = np.array([[1, 0, 2], [0, 2, 1]], np.int64)
    upd = rng.standard_normal((2, 3)).astype(np.float32)
    data = rng.standard_normal((3, 3)).astype(np.float32)
    check("ScatterElements", {"d": data, "i": idx, "u": upd}, {"axis": 0, "reduction": reduction})
    check("ScatterElements", {"d": data, "i": -idx - 1, "u": upd}, {"axis": 1, "reduction": reduction})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    data = rng.standard_normal((4, 3, 2)).astype(np.float32)
    idx = np.array([[0], [2], [0]] if reduction != "none" else [[0], [2], [-1]], np.int64)
    upd = rng.standard_normal((3, 3, 2)).astype(np.float32)
    check("ScatterND", {"d": data, "i": idx, "u": upd}, {"reduction": reduction})
    check("ScatterND", {"d": data, "i": np.array([[1, 2], [3, 0]], np.int64),
                        "u": rng.standard_normal((2, 2)).astype(np.float32)}, {"reduction": reduction})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    past = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    upd = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    wi = I64(1, 5) if mode == "circular" else I64(1, 4)
    check("TensorScatter", {"p": past, "u": upd, "w": wi}, {"mode": mode, "axis": 2}, opset=24)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_ties_keep_lower_index_first(largest):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0]], np.float32)
    vals, idx = check("TopK", {"x": x, "k": I64(4)}, {"largest": largest, "axis": -1}, outputs=2)
    if largest:
        assert idx[0].tolist() == [0, 2, 5, 3]
    check("TopK", {"x": X, "k": I64(2)}, {"largest": largest, "axis": 1}, outputs=2)


@pytest.mark.parametrize("attrs", [{}, {"sorted": 0}, {"axis": 0}, {"axis": -1, "sorted": 1}])
def test_unique(attrs):
    x = np.array([[2, 1, 2], [2, 1, 2], [0, 5, 0]], np.float32)
    if "axis" not in attrs:
        x = x.reshape(-1)   # the reference evaluator's unsorted path only handles 1-D input
    check("Unique", {"x": x}, attrs, outputs=4)


def test_nonzero_compress_and_traits():
    x = (X > 0.3)
    check("NonZero", {"x": x})
    check("Compress", {"x": X, "c": np.array([True, False, True])}, {"axis": 0})
    check("Compress", {"x": X, "c": np.array([False, True])}, {"axis": -1})
    check("Compress", {"x": X, "c": X.reshape(-1) > 1.0})
    for op in ("NonZero", "Unique", "Compress", "NonMaxSuppression"):
        assert lookup(op).has(Trait.DYNAMIC_OUTPUT_SIZE)


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression(center):
    boxes = rng.uniform(0, 1, size=(2, 12, 4)).astype(np.float32)
    if center:
        boxes[..., 2:] *= 0.4
    scores = rng.uniform(0, 1, size=(2, 3, 12)).astype(np.float32)
    scores[0, 0, 3] = scores[0, 0, 4]            # a tie
    check("NonMaxSuppression", {"b": boxes, "s": scores, "m": I64(4), "iou": np.array([0.3], np.float32),
                                "st": np.array([0.2], np.float32)}, {"center_point_box": center})
    check("NonMaxSuppression", {"b": boxes, "s": scores, "m": I64(20), "iou": np.array([0.6], np.float32)},
          {"center_point_box": center})


@pytest.mark.parametrize("mode,ctm,ratio", [("avg", "half_pixel", 0), ("max", "output_half_pixel", 2),
                                            ("avg", "output_half_pixel", 1)])
def test_roi_align(mode, ctm, ratio):
    x = rng.standard_normal((2, 3, 10, 9)).astype(np.float32)
    rois = np.array([[0, 0, 8, 8], [1.5, 2.2, 6.1, 9.9], [-2, -1, 3, 3], [4, 4, 4.2, 4.1]], np.float32)
    check("RoiAlign", {"x": x, "r": rois, "b": I64(0, 1, 1, 0)},
          {"mode": mode, "coordinate_transformation_mode": ctm, "output_height": 3, "output_width": 2,
           "sampling_ratio": ratio, "spatial_scale": 0.9}, rtol=1e-4, atol=1e-5)


def test_gather_symbolic_shape():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 7, 16))
    assert g.op.Gather(x, np.array([[1, 2, 3]], np.int64), axis=1).shape == ("batch", 1, 3, 16)
    i = g.placeholder("i", "int64", ("batch", "seq"))
    assert g.op.Gather(g.placeholder("emb", "float32", (100, 16)), i).shape == ("batch", "seq", 16)


def test_max_roi_pool_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from tests.ops._mathops_util import node_model, run_ours
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array([[0, 1, 1, 6, 7], [1, 0, 0, 11, 9], [0, -3, -2, 2, 3], [1, 4.4, 2.5, 8.6, 5.5],
                     [0, 20, 20, 30, 30]], np.float32)
    model = node_model("MaxRoiPool", {"x": x, "r": rois}, {"pooled_shape": [3, 2], "spatial_scale": 0.8},
                       opset=12)
    model.graph.output[0].type.tensor_type.elem_type = 1
    ours = run_ours(model, {"x": x, "r": rois})[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "r": rois})[0]
    np.testing.assert_array_equal(ours, want)


def test_gather_and_compress_on_strings():
    s = np.array([["a", "bb"], ["c", "d"], ["e", "f"]], dtype=object)
    check("Gather", {"x": s, "i": np.array([2, 0, -1], np.int64)})
    check("GatherND", {"x": s, "i": np.array([[0, 1], [2, 0]], np.int64)})
    check("Compress", {"x": s, "c": np.array([True, False, True])}, {"axis": 0})
