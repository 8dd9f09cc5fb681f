"""Padding: Pad (constant / reflect / edge / wrap, negative pads crop) and CenterCropPad (ONNX semantics)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shapeplan.errors import ExecutionError
from shapeplan.ops._common import const_of, input_at, ints, norm_axis
from shapeplan.ops.registry import Trait, register

VDS = Trait.VALUE_DEPENDENT_SHAPE


# ----------------------------------------------------------------------------- Pad
def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i.remainder(n)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = i.remainder(period)
    return torch.where(i >= n, period - i, i)


def _pad(x: torch.Tensor, pads: list[int], mode: str, value: Any, axes: list[int] | None) -> torch.Tensor:
    rank = x.dim()
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank, "Pad axis") for a in axes]
    k = len(axes)
    if len(pads) != 2 * k:
        raise ExecutionError(f"Pad: expected {2 * k} pads for {k} axes, got {len(pads)}")
    per_axis = {a: (pads[i], pads[k + i]) for i, a in enumerate(axes)}
    # negative pads crop first
    idx = [slice(max(-per_axis.get(a, (0, 0))[0], 0), x.shape[a] - max(-per_axis.get(a, (0, 0))[1], 0))
           for a in range(rank)]
    x = x[tuple(idx)]
    grow = {a: (max(b, 0), max(e, 0)) for a, (b, e) in per_axis.items() if b > 0 or e > 0}
    if not grow:
        return x.clone()
    if mode == "constant":
        flat: list[int] = []
        for a in range(rank - 1, -1, -1):
            flat += list(grow.get(a, (0, 0)))
        v = value.reshape(-1)[0].item() if isinstance(value, torch.Tensor) and value.numel() else (value or 0)
        if x.dtype == torch.bool:
            out = F.pad(x.to(torch.uint8), flat, value=int(bool(v)))
            return out.to(torch.bool)
        return F.pad(x, flat, mode="constant", value=v)
    if mode not in ("edge", "reflect", "wrap"):
        raise ExecutionError(f"Pad: unknown mode {mode!r}; expected constant, reflect, edge or wrap")
    for a, (b, e) in grow.items():
        if x.shape[a] == 0:
            raise ExecutionError(f"Pad: cannot {mode}-pad axis {a} of size 0")
        x = x.index_select(a, _pad_index(x.shape[a], b, e, mode, x.device))
    return x


def _pad_shape(node: Any) -> list:
    x = node.inputs[0]
    if "pads" in node.attrs or "paddings" in node.attrs:
        pads = list(node.attrs.get("pads") or node.attrs.get("paddings"))
        axes = None
    else:
        p, ax = const_of(node.inputs[1]), const_of(input_at(node, 3))
        if p is None or (input_at(node, 3) is not None and ax is None):
            return [(x.dtype, None if x.shape is None else tuple([None] * len(x.shape)))]
        pads, axes = ints(p), (ints(ax) if ax is not None else None)
    if x.shape is None:
        return [(x.dtype, None)]
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    out = list(x.shape)
    k = len(axes)
    for i, a in enumerate(axes):
        add = pads[i] + pads[k + i]
        out[a] = out[a] + add if isinstance(out[a], int) else (out[a] if add == 0 else None)
    return [(x.dtype, tuple(out))]


@register("Pad", since=1, shape=_pad_shape)
def pad_v1(x, *, pads=None, paddings=None, mode="constant", value=0.0):
    """ONNX Pad-1/2 (pads attribute)."""
    return _pad(x, list(pads if pads is not None else paddings), mode, value, None)


@register("Pad", since=11, traits=VDS, shape=_pad_shape, host_inputs=(1, 2, 3))
def pad(x, pads, constant_value=None, axes=None, *, mode="constant"):
    """ONNX Pad: constant / reflect / edge / wrap; negative pads crop; optional axes (18)."""
    return _pad(x, ints(pads), mode, constant_value, None if axes is None else ints(axes))


@register("CenterCropPad", since=18, traits=VDS, host_inputs=(1,))
def center_crop_pad(x, shape, *, axes=None):
    """ONNX CenterCropPad: crop or zero-pad each axis around its centre."""
    rank = x.dim()
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank) for a in axes]
    target = ints(shape)
    new_shape = list(x.shape)
    crop = [slice(None)] * rank
    place = [slice(None)] * rank
    for a, t in zip(axes, target):
        d = x.shape[a]
        new_shape[a] = t
        if t < d:
            s = (d - t) // 2
            crop[a] = slice(s, s + t)
        elif t > d:
            s = (t - d) // 2
            place[a] = slice(s, s + d)
    out = torch.zeros(new_shape, dtype=x.dtype, device=x.device)
    out[tuple(place)] = x[tuple(crop)]
    return out
