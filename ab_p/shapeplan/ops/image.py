"""Image ops: Resize (every ONNX mode), Upsample, GridSample, AffineGrid.

Resize is separable: each resized axis is an independent 1-D interpolation. The (output position ->
input taps, weights) tables depend only on sizes and scales, so they are built on the host with numpy
(exactly following the ONNX reference) and applied on the data's device with one gather + weighted
sum per axis.
"""
from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from shapeplan.errors import ExecutionError
from shapeplan.ops.registry import Trait, register
from shapeplan.ops._common import const_of, norm_axis


# ----------------------------------------------------------------------------- 1-D coefficient tables
def _nearest_coeffs(r: np.ndarray, mode: str) -> np.ndarray:
    exact = r == 1.0
    if mode == "round_prefer_floor":
        right = r > 0.5
    elif mode == "round_prefer_ceil":
        right = r >= 0.5
    elif mode == "floor":
        right = np.zeros_like(exact)
    elif mode == "ceil":
        right = np.ones_like(exact)
    else:
        raise ExecutionError(f"Resize: unknown nearest_mode {mode!r}")
    right = right | exact
    return np.stack([~right, right], axis=1).astype(np.float64)


def _cubic_kernel(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    x2, x3 = x * x, x * x * x
    near = (a + 2) * x3 - (a + 3) * x2 + 1
    far = a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _coeffs(r: np.ndarray, scale: float, mode: str, antialias: bool, a: float, nearest_mode: str) -> np.ndarray:
    """[out, taps] weights for fractional offsets ``r`` in (0, 1]."""
    if mode == "nearest":
        return _nearest_coeffs(r, nearest_mode)
    if mode == "linear":
        if not antialias:
            return np.stack([1 - r, r], axis=1)
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        taps = np.arange(start, start + 2 - 2 * start)
        c = np.clip(1 - np.abs((taps[None, :] - r[:, None]) * s), 0, 1)
        return c / c.sum(axis=1, keepdims=True)
    if mode == "cubic":
        if not antialias:
            return np.stack([_cubic_kernel(r + 1, a), _cubic_kernel(r, a),
                             _cubic_kernel(1 - r, a), _cubic_kernel(2 - r, a)], axis=1)
        s = min(scale, 1.0)
        i_start = int(np.floor(-2 / s) + 1)
        taps = np.arange(i_start, 2 - i_start)
        c = _cubic_kernel(s * (taps[None, :] - r[:, None]), a)
        return c / c.sum(axis=1, keepdims=True)
    raise ExecutionError(f"Resize: unknown mode {mode!r}; expected nearest, linear or cubic")


def _source_coords(ctm: str, y: np.ndarray, scale: float, n_in: int, n_out: int,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    out_w = scale * n_in
    extrap = None
    if ctm == "align_corners":
        x = np.zeros(n_out) if out_w == 1 else y * (n_in - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        r0, r1 = roi if roi is not None else (0.0, 1.0)
        x = np.full(n_out, (r1 - r0) * (n_in - 1) / 2) if out_w == 1 else \
            y * (r1 - r0) * (n_in - 1) / (out_w - 1)
        x = x + r0 * (n_in - 1)
        extrap = (x < 0) | (x > n_in - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / out_w)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ExecutionError(f"Resize: unknown coordinate_transformation_mode {ctm!r}")
    return x, extrap


def _axis_table(n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None,
                cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(taps [out, n] int64 clamped indices, weights [out, n], extrapolated mask [out] or None)."""
    y = np.arange(n_out, dtype=np.float64)
    x, extrap = _source_coords(cfg["ctm"], y, scale, n_in, n_out, roi)
    x_int = np.floor(x)
    r = np.where(x == x_int, 1.0, x - x_int)          # prefer the left pixel: r in (0, 1]
    w = _coeffs(r, scale, cfg["mode"], cfg["antialias"], cfg["a"], cfg["nearest_mode"])
    n = w.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    taps = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if cfg["exclude_outside"]:
        w = np.where((taps < 0) | (taps >= n_in), 0.0, w)
        s = w.sum(axis=1, keepdims=True)
        w = w / np.where(s == 0, 1.0, s)
    return np.clip(taps, 0, n_in - 1), w, extrap


def _resize_axis(x: torch.Tensor, axis: int, n_out: int, scale: float, roi: Any, cfg: dict) -> torch.Tensor:
    taps, w, extrap = _axis_table(x.shape[axis], n_out, scale, roi, cfg)
    dev = x.device
    if cfg["mode"] == "nearest" and extrap is None:
        pick = taps[np.arange(n_out), np.argmax(w, axis=1)]
        return x.index_select(axis, torch.as_tensor(pick, device=dev))
    n = taps.shape[1]
    g = x.index_select(axis, torch.as_tensor(taps.reshape(-1), device=dev))
    g = g.reshape(x.shape[:axis] + (n_out, n) + x.shape[axis + 1:])
    wt = torch.as_tensor(w, dtype=x.dtype, device=dev).reshape((n_out, n) + (1,) * (x.dim() - axis - 1))
    out = (g * wt).sum(axis + 1)
    if extrap is not None and extrap.any():
        m = torch.as_tensor(extrap, device=dev).reshape((n_out,) + (1,) * (x.dim() - axis - 1))
        out = torch.where(m, torch.tensor(cfg["extrapolation_value"], dtype=x.dtype, device=dev), out)
    return out


def _floats(t: Any) -> list[float] | None:
    if t is None or (isinstance(t, torch.Tensor) and t.numel() == 0):
        return None
    return [float(v) for v in (t.reshape(-1).tolist() if isinstance(t, torch.Tensor) else t)]


def _resize(x: torch.Tensor, roi: Any, scales: Any, sizes: Any, cfg: dict, axes: Any,
            policy: str) -> torch.Tensor:
    rank = x.dim()
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank, "Resize axis") for a in axes]
    sc, sz, ro = _floats(scales), _floats(sizes), _floats(roi)
    full_roi: list[float] | None = None
    if ro is not None:
        full_roi = [0.0] * rank + [1.0] * rank
        k = len(axes)
        for i, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = ro[i], ro[k + i]
    in_shape = list(x.shape)
    if sz is not None:
        out = list(in_shape)
        for i, a in enumerate(axes):
            out[a] = int(sz[i])
        factors = [out[i] / in_shape[i] if in_shape[i] else 1.0 for i in range(rank)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            if policy not in ("not_larger", "not_smaller"):
                raise ExecutionError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
            s = pick(factors[a] for a in axes)
            factors = [s if i in axes else 1.0 for i in range(rank)]
            out = [int(s * in_shape[i] + 0.5) if i in axes else in_shape[i] for i in range(rank)]
    elif sc is not None:
        factors = [1.0] * rank
        for i, a in enumerate(axes):
            factors[a] = sc[i]
        out = [int(math.floor(factors[i] * in_shape[i])) for i in range(rank)]
    else:
        raise ExecutionError("Resize needs either scales or sizes")
    orig_dtype = x.dtype
    # integers resize in float64 so that rounding matches the reference; half types in float32
    work = x if x.dtype in (torch.float32, torch.float64) else \
        x.to(torch.float32 if x.dtype.is_floating_point else torch.float64)
    for a in axes:
        r = None if full_roi is None else (full_roi[a], full_roi[rank + a])
        if math.isclose(factors[a], 1.0) and out[a] == work.shape[a] and \
                (r is None or (math.isclose(r[0], 0.0) and math.isclose(r[1], 1.0))):
            continue
        if out[a] == 0:
            shp = list(work.shape)
            shp[a] = 0
            work = work.new_empty(shp)
            continue
        work = _resize_axis(work, a, out[a], factors[a], r, cfg)
    if work is x:
        return x.clone()
    if not orig_dtype.is_floating_point:
        info = torch.iinfo(orig_dtype)
        work = torch.round(work).clamp(info.min, info.max)
    return work.to(orig_dtype)


def _resize_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None)]
    return [(x.dtype, tuple([None] * len(x.shape)))]


@register("Resize", since=10, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_resize_shape, host_inputs=(1,))
def resize_v10(x, scales, *, mode="nearest"):
    """ONNX Resize-10 (asymmetric coordinates, like Upsample)."""
    return _upsample(x, scales, mode)


@register("Resize", since=11, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_resize_shape,
          host_inputs=(1, 2, 3))
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    """ONNX Resize (11-19): nearest/linear/cubic, every coordinate transformation, antialias, axes."""
    cfg = {"mode": mode, "ctm": coordinate_transformation_mode, "a": cubic_coeff_a,
           "antialias": bool(antialias) and mode != "nearest", "exclude_outside": exclude_outside,
           "extrapolation_value": extrapolation_value, "nearest_mode": nearest_mode}
    return _resize(x, roi, scales, sizes, cfg, axes, keep_aspect_ratio_policy)


def _upsample(x: torch.Tensor, scales: Any, mode: str) -> torch.Tensor:
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    cfg = {"mode": mode, "ctm": "asymmetric", "a": -0.75, "antialias": False, "exclude_outside": 0,
           "extrapolation_value": 0.0, "nearest_mode": "floor"}
    return _resize(x, None, scales, None, cfg, None, "stretch")


@register("Upsample", since=7, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_resize_shape)
def upsample_v7(x, *, scales, mode="nearest"):
    """ONNX Upsample-7 (scales attribute)."""
    return _upsample(x, scales, mode)


@register("Upsample", since=9, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_resize_shape, host_inputs=(1,))
def upsample(x, scales, *, mode="nearest"):
    """ONNX Upsample-9 (scales input; asymmetric coordinates, nearest rounds down)."""
    return _upsample(x, scales, mode)


# ----------------------------------------------------------------------------- GridSample / AffineGrid
_GS_MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic",
             "bicubic": "cubic"}


def _gs_shape(node: Any) -> list:
    x, grid = node.inputs
    if x.shape is None or grid.shape is None:
        return [(x.dtype, None)]
    return [(x.dtype, tuple(x.shape[:2]) + tuple(grid.shape[1:-1]))]


def _reflect(c: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Reflect coordinates into [lo, hi] off the nearer border, as many times as needed."""
    span = hi - lo
    if span <= 0:
        return torch.full_like(c, lo)
    below = c < lo
    d = torch.where(below, lo - c, c - hi)
    flips = torch.floor(d / span)
    r = d - flips * span
    even = flips.remainder(2) == 0
    inside_val = torch.where(below, torch.where(even, lo + r, hi - r), torch.where(even, hi - r, lo + r))
    return torch.where((c < lo) | (c > hi), inside_val, c)


def _cubic_weights(t: torch.Tensor, a: float = -0.75) -> torch.Tensor:
    """[..., 4] cubic convolution weights for taps floor-1 .. floor+2 at fraction t."""
    ts = torch.stack([t + 1, t, 1 - t, 2 - t], dim=-1).abs()
    near = ((a + 2) * ts - (a + 3)) * ts * ts + 1
    far = ((a * ts - 5 * a) * ts + 8 * a) * ts - 4 * a
    return torch.where(ts <= 1, near, torch.where(ts < 2, far, torch.zeros_like(ts)))


def _grid_taps(coord: torch.Tensor, size: int, mode: str, padding: str, align: bool):
    """One spatial dim: (tap indices [.., T], weights [.., T], valid [.., T]) following onnx.reference."""
    pix = (coord + 1) / 2 * (size - 1) if align else ((coord + 1) * size - 1) / 2
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        pix = torch.round(pix)                                  # half to even, like PyTorch
    if padding == "border":
        pix = torch.where((pix < lo) | (pix > hi), pix.clamp(0, size - 1), pix)
    elif padding == "reflection":
        pix = _reflect(pix, lo, hi)
    if mode == "nearest":
        taps, w = pix.trunc().unsqueeze(-1), torch.ones_like(pix).unsqueeze(-1)
    elif mode == "linear":
        x0 = pix.floor()
        t = pix - x0
        taps, w = torch.stack([x0, x0 + 1], -1), torch.stack([1 - t, t], -1)
    else:
        x0 = pix.floor()
        taps = torch.stack([x0 - 1, x0, x0 + 1, x0 + 2], -1)
        w = _cubic_weights(pix - x0)
    if padding == "zeros":
        valid = (taps >= 0) & (taps <= size - 1)
    else:
        valid = torch.ones_like(taps, dtype=torch.bool)
        if padding == "reflection":
            taps = _reflect(taps, lo, hi).trunc()
    return taps.clamp(0, size - 1).to(torch.int64), w, valid


@register("GridSample", since=16, shape=_gs_shape)
def grid_sample(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """ONNX GridSample: x [N, C, *in] sampled at grid [N, *out, r] (x, y[, z] in [-1, 1]); any rank,
    nearest/linear/cubic, zeros/border/reflection padding, exactly as onnx.reference computes it."""
    if mode not in _GS_MODES:
        raise ExecutionError(f"GridSample: unknown mode {mode!r}; expected linear, nearest or cubic")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ExecutionError(f"GridSample: unknown padding_mode {padding_mode!r}")
    tmode = _GS_MODES[mode]
    nd = x.dim() - 2
    n, c = x.shape[:2]
    sizes = list(x.shape[2:])
    g = grid.to(torch.float64).reshape(n, -1, nd)                        # [N, P, nd], (x, y, z) order
    dims = [_grid_taps(g[..., nd - 1 - d], sizes[d], tmode, padding_mode, bool(align_corners))
            for d in range(nd)]
    flat = x.reshape(n, c, -1).to(torch.float64)
    out = torch.zeros(n, c, g.shape[1], dtype=torch.float64, device=x.device)
    for combo in itertools.product(*[range(t.shape[-1]) for t, _, _ in dims]):
        lin = torch.zeros_like(dims[0][0][..., 0])
        w = torch.ones_like(dims[0][1][..., 0])
        for d, k in enumerate(combo):
            taps, wd, valid = dims[d]
            lin = lin * sizes[d] + taps[..., k]
            w = w * torch.where(valid[..., k], wd[..., k], torch.zeros_like(wd[..., k]))
        vals = torch.gather(flat, 2, lin.unsqueeze(1).expand(n, c, lin.shape[1]))
        out += vals * w.unsqueeze(1)
    return out.to(x.dtype).reshape((n, c) + tuple(grid.shape[1:-1]))


def _affine_grid_shape(node: Any) -> list:
    theta, size = node.inputs
    s = const_of(size)
    if s is None:
        return [(theta.dtype, None)]
    dims = [int(v) for v in s.tolist()]
    return [(theta.dtype, (dims[0], *dims[2:], len(dims) - 2))]


@register("AffineGrid", since=20, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_affine_grid_shape,
          host_inputs=(1,))
def affine_grid(theta, size, *, align_corners=0):
    """ONNX AffineGrid: theta [N, 2, 3] / [N, 3, 4] and size (N, C, H, W[, D]) -> grid [N, *sp, r]."""
    dims = [int(v) for v in size.reshape(-1).tolist()]
    return F.affine_grid(theta, dims, align_corners=bool(align_corners))
