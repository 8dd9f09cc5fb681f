"""ops/tensor.py, views.py, padding.py, blocks.py: data-movement ops vs the ONNX reference / numpy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan.ops.registry import Trait, lookup
from tests.ops._mathops_util import check, node_model, run_ours

rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731


@pytest.mark.parametrize("shape,allowzero", [((4, 0, 2), 0), ((-1, 4), 0), ((0, -1), 0), ((24,), 0),
                                             ((2, 12), 1)])
def test_reshape(shape, allowzero):
    check("Reshape", {"x": X, "s": I64(*shape)}, {"allowzero": allowzero}, opset=14)


def test_reshape_allowzero_keeps_zero():
    x = np.zeros((0, 3, 4), np.float32)
    (y,) = check("Reshape", {"x": x, "s": I64(3, 4, 0)}, {"allowzero": 1}, opset=14)
    assert y.shape == (3, 4, 0)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    check("Transpose", {"x": X}, {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    check("Concat", {"a": X, "b": X * 2}, {"axis": axis})


def test_split_forms():
    x = np.arange(10, dtype=np.float32)
    check("Split", {"x": x}, {"axis": 0, "num_outputs": 3}, outputs=3, opset=18)   # 4, 4, 2
    check("Split", {"x": x, "s": I64(2, 8)}, {"axis": 0}, outputs=2, opset=13)
    check("Split", {"x": x}, {"axis": 0, "split": [3, 7]}, outputs=2, opset=11)
    check("Split", {"x": x}, {"axis": 0}, outputs=5, opset=13)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 1], [2, 3], None, None), ([-1], [-100], [2], [-1]), ([3], [0], [2], [-2]),
    ([1], [2 ** 62], [1], [1]), ([-5], [5], [0], [1]), ([10], [20], [2], [1]),
])
def test_slice(starts, ends, axes, steps):
    inputs = {"x": X, "st": I64(*starts), "en": I64(*ends),
              "ax": None if axes is None else I64(*axes), "sp": None if steps is None else I64(*steps)}
    if axes is None and steps is None:
        inputs.pop("ax"), inputs.pop("sp")
    check("Slice", inputs)


def test_slice_v1_attributes():
    check("Slice", {"x": X}, {"starts": [1, 0], "ends": [2, -1], "axes": [0, 2]}, opset=9)


def test_squeeze_unsqueeze_both_forms():
    x = X.reshape(2, 1, 3, 1, 4)
    check("Squeeze", {"x": x}, {"axes": [1, -2]}, opset=11)
    check("Squeeze", {"x": x, "a": I64(1)})
    check("Squeeze", {"x": x})
    check("Unsqueeze", {"x": X}, {"axes": [0, 4]}, opset=11)
    check("Unsqueeze", {"x": X, "a": I64(-1, 0)})


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", {"x": X}, {"axis": axis})


def test_expand_tile_trilu_where():
    check("Expand", {"x": X[:, :1], "s": I64(3, 1, 1, 1)})
    check("Tile", {"x": X, "r": I64(1, 2, 3)})
    for upper in (0, 1):
        for k in (-1, 0, 2):
            check("Trilu", {"x": X, "k": np.array(k, np.int64)}, {"upper": upper})
    check("Where", {"c": X > 0, "a": X, "b": -X})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize("pads,axes", [([1, 0, 2, 2, 1, 0], None), ([2, 1], [-1]), ([1, 3, 0, 2], [0, 2])])
def test_pad(mode, pads, axes):
    inputs = {"x": X, "p": I64(*pads), "v": np.array(1.5, np.float32)}
    if axes is not None:
        inputs["a"] = I64(*axes)
    check("Pad", inputs, {"mode": mode}, opset=19)


def test_pad_negative_crops():
    ours = run_ours(node_model("Pad", {"x": X, "p": I64(0, -1, 1, 0, 0, -1)}, opset=19),
                    {"x": X, "p": I64(0, -1, 1, 0, 0, -1)})[0]
    np.testing.assert_array_equal(ours, np.pad(X, [(0, 0), (0, 0), (1, 0)])[:, 1:, :-1])


def test_reverse_sequence_depth_space():
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    check("ReverseSequence", {"x": x, "l": I64(4, 1, 3)}, {"batch_axis": 1, "time_axis": 0})
    check("ReverseSequence", {"x": x.transpose(1, 0, 2).copy(), "l": I64(2, 4, 1)},
          {"batch_axis": 0, "time_axis": 1})
    img = rng.standard_normal((2, 8, 3, 2)).astype(np.float32)
    for mode in ("DCR", "CRD"):
        check("DepthToSpace", {"x": img}, {"blocksize": 2, "mode": mode})
    check("SpaceToDepth", {"x": img.reshape(2, 2, 6, 4)}, {"blocksize": 2})


def test_center_crop_pad():
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    check("CenterCropPad", {"x": x, "s": I64(3, 7)}, {"axes": [0, -2]})
    check("CenterCropPad", {"x": x, "s": I64(6, 2, 3)})


def test_col2im_2d_matches_torch_fold_and_reference():
    x = rng.standard_normal((1, 2 * 9, 9)).astype(np.float32)
    feeds = {"x": x, "i": I64(6, 6), "b": I64(3, 3)}
    (y,) = run_ours(node_model("Col2Im", feeds, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, opset=18), feeds)
    want = torch.nn.functional.fold(torch.from_numpy(x), (6, 6), (3, 3), padding=1, stride=2).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((2, 3 * 4, 15)).astype(np.float32)
    check("Col2Im", {"x": x, "i": I64(5, 6), "b": I64(2, 2)},
          {"dilations": [1, 2], "pads": [1, 0, 0, 1], "strides": [2, 1]}, opset=18)
    x5 = rng.standard_normal((1, 2 * 8, 8)).astype(np.float32)
    check("Col2Im", {"x": x5, "i": I64(3, 3, 3), "b": I64(2, 2, 2)}, opset=18)


def test_identity_and_traits():
    check("Identity", {"x": X})
    assert lookup("Reshape", opset=21).has(Trait.VIEW | Trait.VALUE_DEPENDENT_SHAPE)
    for op in ("Identity", "Squeeze", "Unsqueeze", "Flatten"):
        assert lookup(op).has(Trait.VIEW)
    for op in ("Expand", "Tile", "Slice"):
        assert lookup(op).has(Trait.VALUE_DEPENDENT_SHAPE)


def test_symbolic_shapes():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 12, 64))
    assert g.op.Reshape(x, np.array([0, -1], np.int64)).shape == ("batch", 768)
    assert g.op.Reshape(x, np.array([-1, 64], np.int64)).shape == (None, 64)
    assert g.op.Reshape(x, np.array([0, 3, -1], np.int64)).shape == ("batch", 3, 256)
    assert g.op.Transpose(x, perm=[2, 0, 1]).shape == (64, "batch", 12)
    assert g.op.Concat(x, x, axis=1).shape == ("batch", 24, 64)
    assert g.op.Flatten(x, axis=1).shape == ("batch", 768)
    assert g.op.Unsqueeze(x, np.array([1], np.int64)).shape == ("batch", 1, 12, 64)
    assert g.op.Slice(x, np.array([2], np.int64), np.array([-1], np.int64),
                      np.array([2], np.int64)).shape == ("batch", 12, 61)
    parts = g.op.Split(x, np.array([4, 8], np.int64), axis=1, _outputs=2)
    assert [p.shape for p in parts] == [("batch", 4, 64), ("batch", 8, 64)]
    assert g.op.Pad(x, np.array([0, 1, 0, 0, 1, 0], np.int64)).shape == ("batch", 14, 64)


def test_squeeze_of_non_unit_axis_names_the_node():
    model = node_model("Squeeze", {"x": X, "a": I64(0)})
    with pytest.raises(sp.ShapeplanError, match="Squeeze"):
        run_ours(model, {"x": X, "a": I64(0)})


def test_data_movement_ops_on_strings():
    s = np.array([["a", "bb", "c"], ["d", "e", "ff"]], dtype=object)
    check("Reshape", {"x": s, "s": I64(3, -1)})
    check("Transpose", {"x": s})
    check("Concat", {"a": s, "b": s[:, :1].copy()}, {"axis": 1})
    check("Slice", {"x": s, "st": I64(-1), "en": I64(-10), "ax": I64(1), "sp": I64(-2)})
    check("Unsqueeze", {"x": s, "a": I64(0)})
    check("Split", {"x": s}, {"axis": 1, "num_outputs": 2}, outputs=2, opset=18)
    check("Where", {"c": np.array([True, False, True]), "a": s, "b": np.array(["z"], dtype=object)})
    check("Tile", {"x": s, "r": I64(2, 1)})
