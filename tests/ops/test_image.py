"""ops/image.py: Resize/Upsample/GridSample/AffineGrid vs the ONNX reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest

from tests.ops._mathops_util import check

rng = np.random.default_rng(2)
IMG = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
F32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
I64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
EMPTY = np.zeros((0,), np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                                 "half_pixel_symmetric"])
@pytest.mark.parametrize("scales", [(1, 1, 1.7, 0.6), (1, 1, 0.5, 2.0)])
def test_resize_scales(mode, ctm, scales):
    check("Resize", {"x": IMG, "roi": EMPTY, "s": F32(*scales)},
          {"mode": mode, "coordinate_transformation_mode": ctm}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_modes_with_sizes(nearest_mode):
    check("Resize", {"x": IMG, "roi": EMPTY, "s": None, "sz": I64(1, 2, 9, 4)},
          {"mode": "nearest", "nearest_mode": nearest_mode})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_exclude_outside_axes_policy(mode):
    check("Resize", {"x": IMG, "roi": EMPTY, "s": F32(0.6, 0.45)},
          {"mode": mode, "antialias": 1, "axes": [2, 3]}, rtol=1e-4, atol=1e-5)
    check("Resize", {"x": IMG, "roi": EMPTY, "s": F32(1, 1, 0.7, 1.3)},
          {"mode": mode, "exclude_outside": 1, "cubic_coeff_a": -0.5}, rtol=1e-4, atol=1e-5)
    for policy in ("not_larger", "not_smaller"):
        check("Resize", {"x": IMG, "roi": EMPTY, "s": None, "sz": I64(8, 8)},
              {"mode": mode, "axes": [3, 2], "keep_aspect_ratio_policy": policy}, rtol=1e-4, atol=1e-5)


def test_resize_tf_crop_and_resize_and_uint8():
    check("Resize", {"x": IMG, "roi": F32(0, 0, 0.2, 0.1, 1, 1, 1.2, 0.8), "s": None, "sz": I64(1, 2, 4, 7)},
          {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
           "extrapolation_value": 9.0}, rtol=1e-4, atol=1e-5)
    img8 = rng.integers(0, 255, size=(1, 1, 4, 4)).astype(np.uint8)
    check("Resize", {"x": img8, "roi": EMPTY, "s": F32(1, 1, 1.5, 1.5)}, {"mode": "linear"})


def test_upsample():
    check("Upsample", {"x": IMG, "s": F32(1, 1, 2, 3)}, {"mode": "nearest"}, opset=9)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample(mode, padding_mode, align):
    grid = rng.uniform(-1.3, 1.3, size=(1, 4, 3, 2)).astype(np.float32)
    check("GridSample", {"x": IMG, "g": grid}, {"mode": mode, "padding_mode": padding_mode,
                                               "align_corners": align}, rtol=1e-4, atol=1e-5)


def test_grid_sample_volumetric():
    vol = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, size=(1, 2, 3, 2, 3)).astype(np.float32)
    for mode in ("linear", "nearest"):
        check("GridSample", {"x": vol, "g": grid}, {"mode": mode}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(align):
    theta2 = rng.standard_normal((2, 2, 3)).astype(np.float32)
    check("AffineGrid", {"t": theta2, "s": I64(2, 3, 4, 5)}, {"align_corners": align}, rtol=1e-4, atol=1e-5)
    theta3 = rng.standard_normal((1, 3, 4)).astype(np.float32)
    check("AffineGrid", {"t": theta3, "s": I64(1, 1, 2, 3, 4)}, {"align_corners": align}, rtol=1e-4, atol=1e-5)
