"""Indexing ops: Gather*, Scatter*, TensorScatter, TopK, Unique, NonZero, Compress,
NonMaxSuppression, RoiAlign."""
from __future__ import annotations

import math
from typing import Any

import torch

from shapeplan.errors import ExecutionError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import same_as
from shapeplan.ops._common import const_of, ints, norm_axis, strings_ok

INT64 = as_dtype("int64")
DYN = Trait.DYNAMIC_OUTPUT_SIZE


def _wrap(idx: torch.Tensor, dim: int) -> torch.Tensor:
    idx = idx.to(torch.int64)
    return torch.where(idx < 0, idx + dim, idx)


# ----------------------------------------------------------------------------- Gather family
def _gather_shape(node: Any) -> list:
    x, idx = node.inputs
    if x.shape is None or idx.shape is None:
        return [(x.dtype, None)]
    axis = node.attrs.get("axis", 0)
    axis = axis + len(x.shape) if axis < 0 else axis
    return [(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]


@register("Gather", since=1, shape=_gather_shape)
@strings_ok
def gather(x, indices, *, axis=0):
    """ONNX Gather: take slices along ``axis`` (negative indices count from the end)."""
    axis = norm_axis(axis, x.dim())
    idx = _wrap(indices, x.shape[axis])
    out = x.index_select(axis, idx.reshape(-1))
    return out.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])


@register("GatherElements", since=11, shape=lambda n: [(n.inputs[0].dtype, n.inputs[1].shape)])
@strings_ok
def gather_elements(x, indices, *, axis=0):
    """ONNX GatherElements (torch.gather with negative indices)."""
    axis = norm_axis(axis, x.dim())
    return torch.gather(x, axis, _wrap(indices, x.shape[axis]))


def _gathernd_shape(node: Any) -> list:
    x, idx = node.inputs
    b = node.attrs.get("batch_dims", 0)
    if x.shape is None or idx.shape is None or not isinstance(idx.shape[-1], int):
        return [(x.dtype, None)]
    k = idx.shape[-1]
    return [(x.dtype, idx.shape[:-1] + x.shape[b + k:])]


@register("GatherND", since=11, shape=_gathernd_shape)
@strings_ok
def gather_nd(x, indices, *, batch_dims=0):
    """ONNX GatherND: indices[..., k] address the first k non-batch dims of x."""
    b = batch_dims
    k = indices.shape[-1]
    batch = x.shape[:b]
    nb = math.prod(batch)
    xf = x.reshape((nb,) + x.shape[b:])                                  # [B, D...]
    idx = indices.reshape(nb, -1, k).to(torch.int64)                      # [B, I, k]
    coords = [_wrap(idx[..., j], x.shape[b + j]) for j in range(k)]
    bidx = torch.arange(nb, device=x.device).view(-1, 1).expand(idx.shape[:2])
    out = xf[(bidx, *coords)]                                             # [B, I, D[k:]...]
    return out.reshape(indices.shape[:-1] + x.shape[b + k:])


# ----------------------------------------------------------------------------- Scatter family
_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_elements(x, indices, updates, axis, reduction):  # noqa: ANN001, ANN202
    axis = norm_axis(axis, x.dim())
    idx = _wrap(indices, x.shape[axis])
    if reduction == "none":
        return x.scatter(axis, idx, updates)
    if reduction not in _REDUCE:
        raise ExecutionError(f"ScatterElements: unknown reduction {reduction!r}")
    return x.scatter_reduce(axis, idx, updates, _REDUCE[reduction], include_self=True)


@register("Scatter", since=9, shape=same_as(0))
@strings_ok
def scatter(x, indices, updates, *, axis=0):
    """ONNX Scatter (deprecated alias of ScatterElements without reduction)."""
    return _scatter_elements(x, indices, updates, axis, "none")


@register("ScatterElements", since=11, shape=same_as(0))
@strings_ok
def scatter_elements(x, indices, updates, *, axis=0, reduction="none"):
    """ONNX ScatterElements (reduction none/add/mul/max/min)."""
    return _scatter_elements(x, indices, updates, axis, reduction)


@register("ScatterND", since=11, shape=same_as(0))
@strings_ok
def scatter_nd(x, indices, updates, *, reduction="none"):
    """ONNX ScatterND: indices[..., k] address slices of x's first k dims."""
    k = indices.shape[-1]
    lead = x.shape[:k]
    rest = math.prod(x.shape[k:])
    idx = indices.reshape(-1, k).to(torch.int64)
    lin = torch.zeros(idx.shape[0], dtype=torch.int64, device=x.device)
    for j in range(k):
        lin = lin * lead[j] + _wrap(idx[:, j], lead[j])
    out = x.clone().reshape(math.prod(lead), rest)                        # [P, R]
    upd = updates.reshape(-1, rest).to(x.dtype)                           # [M, R]
    if reduction == "none":
        out[lin] = upd
    elif reduction == "add":
        out.index_add_(0, lin, upd)
    elif reduction in _REDUCE:
        out.scatter_reduce_(0, lin.view(-1, 1).expand_as(upd), upd, _REDUCE[reduction], include_self=True)
    else:
        raise ExecutionError(f"ScatterND: unknown reduction {reduction!r}")
    return out.reshape(x.shape)


@register("TensorScatter", since=24, shape=same_as(0))
def tensor_scatter(past, update, write_indices=None, *, axis=-2, mode="linear"):
    """ONNX TensorScatter (KV-cache update): write ``update`` into ``past`` along ``axis`` starting at
    ``write_indices[b]`` for batch entry b; ``circular`` wraps around the axis."""
    axis = norm_axis(axis, past.dim())
    if axis == 0:
        raise ExecutionError("TensorScatter: axis 0 is the batch axis")
    n_batch, seq, cap = past.shape[0], update.shape[axis], past.shape[axis]
    start = (torch.zeros(n_batch, dtype=torch.int64, device=past.device) if write_indices is None
             else write_indices.to(device=past.device, dtype=torch.int64))
    pos = start.view(-1, 1) + torch.arange(seq, device=past.device).view(1, -1)     # [B, S]
    if mode == "circular":
        pos = pos.remainder(cap)
    elif mode != "linear":
        raise ExecutionError(f"TensorScatter: unknown mode {mode!r}; expected linear or circular")
    view = [1] * past.dim()
    view[0], view[axis] = n_batch, seq
    return past.scatter(axis, pos.view(view).expand(update.shape), update)


# ----------------------------------------------------------------------------- TopK
def _topk_shape(node: Any) -> list:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None), (INT64, None)]
    axis = node.attrs.get("axis", -1)
    axis = axis + len(x.shape) if axis < 0 else axis
    k: Any = node.attrs.get("k")
    if len(node.inputs) > 1:
        kc = const_of(node.inputs[1])
        k = ints(kc)[0] if kc is not None else None
    out = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [(x.dtype, out), (INT64, out)]


def _topk(x: torch.Tensor, k: int, axis: int, largest: int, sorted_: int) -> tuple:
    axis = norm_axis(axis, x.dim())
    # a stable sort keeps the lower index first among equal values, as ONNX requires
    vals, idx = torch.sort(x, dim=axis, descending=bool(largest), stable=True)
    return vals.narrow(axis, 0, k).contiguous(), idx.narrow(axis, 0, k).contiguous()


@register("TopK", since=1, shape=_topk_shape)
def topk_v1(x, *, k, axis=-1):
    """ONNX TopK-1 (k attribute)."""
    return _topk(x, k, axis, 1, 1)


@register("TopK", since=10, traits=Trait.VALUE_DEPENDENT_SHAPE, shape=_topk_shape, host_inputs=(1,))
def topk(x, k, *, axis=-1, largest=1, sorted=1):  # noqa: A002
    """ONNX TopK: values and int64 indices of the k largest (or smallest) along ``axis``."""
    return _topk(x, ints(k)[0], axis, largest, sorted)


# ----------------------------------------------------------------------------- Unique / NonZero / Compress
@register("Unique", since=11, traits=DYN)
def unique(x, *, axis=None, sorted=1, _n_out):  # noqa: A002
    """ONNX Unique: (values, first-occurrence indices, inverse indices, counts)."""
    src = x.reshape(-1) if axis is None else x
    dim = 0 if axis is None else norm_axis(axis, x.dim())
    y, inverse, counts = torch.unique(src, sorted=True, return_inverse=True, return_counts=True, dim=dim)
    n = y.shape[dim]
    pos = torch.arange(src.shape[dim], device=x.device)
    first = torch.full((n,), src.shape[dim], dtype=torch.int64, device=x.device)
    first = first.scatter_reduce(0, inverse, pos, "amin", include_self=True)
    if not sorted:
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(n, device=x.device)
        y = y.index_select(dim, order)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    outs = (y, first, inverse.reshape(-1), counts)
    return outs[:_n_out]


@register("NonZero", since=9, traits=DYN)
def nonzero(x):
    """ONNX NonZero: [rank, nnz] int64 coordinates in row-major order."""
    if x.dim() == 0:
        x = x.reshape(1)
    return torch.nonzero(x).t().contiguous()


@register("Compress", since=9, traits=DYN)
@strings_ok
def compress(x, condition, *, axis=None):
    """ONNX Compress: keep slices along ``axis`` (flattened when absent) where condition is true."""
    src = x.reshape(-1) if axis is None else x
    dim = 0 if axis is None else norm_axis(axis, x.dim())
    cond = condition.reshape(-1).to(torch.bool)[: src.shape[dim]]
    keep = torch.nonzero(cond).reshape(-1)
    return src.index_select(dim, keep)


# ----------------------------------------------------------------------------- NonMaxSuppression
def _corners(b: torch.Tensor, center: int) -> tuple:
    if center:
        xc, yc, w, h = b.unbind(-1)
        return xc - w / 2, yc - h / 2, xc + w / 2, yc + h / 2
    y1, x1, y2, x2 = b.unbind(-1)
    return torch.minimum(x1, x2), torch.minimum(y1, y2), torch.maximum(x1, x2), torch.maximum(y1, y2)


def _suppression_matrix(boxes: torch.Tensor, center: int, thr: float) -> torch.Tensor:
    """[N, N] bool: box i suppresses box j (IoU > thr; degenerate boxes never suppress)."""
    x0, y0, x1, y1 = _corners(boxes.to(torch.float64), center)
    iw = torch.minimum(x1[:, None], x1[None, :]) - torch.maximum(x0[:, None], x0[None, :])
    ih = torch.minimum(y1[:, None], y1[None, :]) - torch.maximum(y0[:, None], y0[None, :])
    inter = iw.clamp(min=0) * ih.clamp(min=0)
    area = (x1 - x0) * (y1 - y0)
    union = area[:, None] + area[None, :] - inter
    valid = (iw > 0) & (ih > 0) & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    iou = torch.where(valid, inter / torch.where(union > 0, union, torch.ones_like(union)), 0.0)
    return valid & (iou > thr)


@register("NonMaxSuppression", since=10, traits=DYN)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    """ONNX NonMaxSuppression: greedy per (batch, class); rows [batch, class, box] int64."""
    max_out = max(ints(max_output_boxes_per_class)[0], 0) if max_output_boxes_per_class is not None \
        and max_output_boxes_per_class.numel() else 0
    thr = float(iou_threshold.reshape(-1)[0]) if iou_threshold is not None and iou_threshold.numel() else 0.0
    sthr = float(score_threshold.reshape(-1)[0]) if score_threshold is not None and \
        score_threshold.numel() else None
    rows: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0] if max_out else 0):
        sup = _suppression_matrix(boxes[b], center_point_box, thr).cpu()
        for c in range(scores.shape[1]):
            s = scores[b, c]
            order = torch.sort(s, descending=True, stable=True).indices
            if sthr is not None:
                order = order[s[order] > sthr]
            kept: list[int] = []
            for i in order.tolist():
                if len(kept) >= max_out:
                    break
                if not kept or not bool(sup[kept, i].any()):
                    kept.append(i)
                    rows.append((b, c, i))
    return torch.tensor(rows, dtype=torch.int64, device=boxes.device).reshape(-1, 3)


# ----------------------------------------------------------------------------- RoiAlign
def _roi_axis(start: float, bin_size: float, pooled: int, grid: int, size: int, dev: torch.device):
    """Per-axis sample positions of one ROI: (low, high, frac, valid), each [pooled * grid]."""
    p = torch.arange(pooled, dtype=torch.float64, device=dev).view(-1, 1)
    g = torch.arange(grid, dtype=torch.float64, device=dev).view(1, -1)
    c = (start + p * bin_size + (g + 0.5) * bin_size / grid).reshape(-1)
    valid = (c >= -1.0) & (c <= size)
    c = c.clamp(min=0)
    low = c.floor().to(torch.int64)
    at_end = low >= size - 1
    low = torch.where(at_end, torch.full_like(low, size - 1), low)
    high = torch.where(at_end, low, low + 1)
    frac = torch.where(at_end, torch.zeros_like(c), c - low.to(c.dtype))
    return low, high, frac, valid


def _roi_align(x, rois, batch_indices, mode, oh, ow, sampling_ratio, spatial_scale, half_pixel):  # noqa: ANN001, ANN202
    n_roi = rois.shape[0]
    c_, h, w = x.shape[1:]
    out = torch.zeros(n_roi, c_, oh, ow, dtype=x.dtype, device=x.device)
    off = 0.5 if half_pixel else 0.0
    for r, (roi, bi) in enumerate(zip(rois.to(torch.float64).tolist(), ints(batch_indices))):
        x0, y0, x1, y1 = (v * spatial_scale - off for v in roi)
        rw, rh = x1 - x0, y1 - y0
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rh / oh))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rw / ow))
        if gh <= 0 or gw <= 0:
            continue
        yl, yh, ly, vy = _roi_axis(y0, bh, oh, gh, h, x.device)
        xl, xh, lx, vx = _roi_axis(x0, bw, ow, gw, w, x.device)
        mask = (vy[:, None] & vx[None, :]).to(torch.float64)              # [OH*gh, OW*gw]
        hy, hx = 1 - ly, 1 - lx
        img = x[bi]                                                       # [C, H, W]
        terms = []
        for yi, wy in ((yl, hy), (yh, ly)):
            rows = img.index_select(1, yi)
            for xi, wx in ((xl, hx), (xh, lx)):
                wgt = (wy[:, None] * wx[None, :] * mask).to(x.dtype)
                terms.append(wgt * rows.index_select(2, xi))               # [C, OH*gh, OW*gw]
        vals = torch.stack(terms).reshape(4, c_, oh, gh, ow, gw)
        if mode == "avg":
            out[r] = vals.sum(0).sum(dim=(2, 4)) / max(gh * gw, 1)
        else:
            out[r] = vals.amax(0).amax(dim=(2, 4))
    return out


@register("RoiAlign", since=10)
def roi_align_v10(x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1,
                  sampling_ratio=0, spatial_scale=1.0):
    """ONNX RoiAlign-10 (output_half_pixel coordinates)."""
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
                      spatial_scale, False)


@register("RoiAlign", since=16)
def roi_align(x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
              output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """ONNX RoiAlign: x [N, C, H, W], rois [R, 4] (x1, y1, x2, y2) -> [R, C, OH, OW]."""
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
                      spatial_scale, coordinate_transformation_mode == "half_pixel")


# ----------------------------------------------------------------------------- MaxRoiPool
def _round_away(v: float) -> int:
    return int(math.floor(v + 0.5)) if v >= 0 else int(math.ceil(v - 0.5))


@register("MaxRoiPool", since=1)
def max_roi_pool(x, rois, *, pooled_shape, spatial_scale=1.0):
    """ONNX MaxRoiPool: rois [R, 5] (batch, x1, y1, x2, y2) -> [R, C, ph, pw] max over each bin
    (bins of an empty intersection with the image give 0)."""
    ph_n, pw_n = pooled_shape
    h, w = x.shape[2:]
    out = torch.zeros(rois.shape[0], x.shape[1], ph_n, pw_n, dtype=x.dtype, device=x.device)
    for r, (b, x1, y1, x2, y2) in enumerate(rois.to(torch.float64).tolist()):
        sw, sh = _round_away(x1 * spatial_scale), _round_away(y1 * spatial_scale)
        ew, eh = _round_away(x2 * spatial_scale), _round_away(y2 * spatial_scale)
        bh, bw = max(eh - sh + 1, 1) / ph_n, max(ew - sw + 1, 1) / pw_n
        img = x[int(b)]
        for i in range(ph_n):
            hs = min(max(math.floor(i * bh) + sh, 0), h)
            he = min(max(math.ceil((i + 1) * bh) + sh, 0), h)
            for j in range(pw_n):
                ws = min(max(math.floor(j * bw) + sw, 0), w)
                we = min(max(math.ceil((j + 1) * bw) + sw, 0), w)
                if he > hs and we > ws:
                    out[r, :, i, j] = img[:, hs:he, ws:we].amax(dim=(1, 2))
    return out
