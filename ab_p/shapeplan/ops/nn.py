"""Convolution family: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, LRN.

Pooling lives in ops/pool.py. Spatial helpers shared by both are defined here.
Layout everywhere is ONNX's channels-first ``[N, C, *spatial]``; pads are
``[b_1, ..., b_n, e_1, ..., e_n]`` (begin pads then end pads).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from shapeplan.errors import ShapeError
from shapeplan.ops.registry import register

# ---------------------------------------------------------------------------------------- helpers


def spatial_attrs(n: int, kernel: Sequence[int], strides: Sequence[int] | None,
                  dilations: Sequence[int] | None) -> tuple[list[int], list[int], list[int]]:
    k = [int(v) for v in kernel]
    s = [int(v) for v in strides] if strides else [1] * n
    d = [int(v) for v in dilations] if dilations else [1] * n
    return k, s, d


def resolve_pads(auto_pad: str, in_sizes: Sequence[int], k: Sequence[int], s: Sequence[int],
                 d: Sequence[int], pads: Sequence[int] | None) -> list[int]:
    """Begin/end pads for a forward (conv/pool) window, honouring ``auto_pad``."""
    n = len(in_sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_sizes[i] // s[i])
            total = max((out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sizes[i], 0)
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        return begin + end
    if auto_pad == "VALID":
        return [0] * (2 * n)
    return [int(p) for p in pads] if pads else [0] * (2 * n)


def pad_spatial(x: torch.Tensor, pads: Sequence[int], value: float = 0.0) -> torch.Tensor:
    """Pad (or crop, for negative pads) the trailing ``len(pads)//2`` dims of ``x``."""
    n = len(pads) // 2
    if not any(pads):
        return x
    torch_pads: list[int] = []
    for i in reversed(range(n)):            # F.pad lists the last dim first
        torch_pads += [int(pads[i]), int(pads[i + n])]
    if x.dtype == torch.bool:
        return F.pad(x.to(torch.uint8), torch_pads, value=value).to(torch.bool)
    return F.pad(x, torch_pads, value=value)


def conv_nd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride: Sequence[int],
            dilation: Sequence[int], groups: int, pads: Sequence[int] | None = None) -> torch.Tensor:
    """Zero-padded convolution; symmetric pads go to torch, asymmetric ones are applied first."""
    n = x.dim() - 2
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(n)
    if fn is None:
        raise ShapeError(f"Conv supports 1-3 spatial dims, got input shape {list(x.shape)}")
    padding: Any = 0
    if pads is not None and any(pads):
        if list(pads[:n]) == list(pads[n:]):
            padding = [int(v) for v in pads[:n]]
        else:
            x = pad_spatial(x, pads)
    return fn(x, w, b, list(stride), padding, list(dilation), groups)


def _kernel_shape(w: torch.Tensor, kernel_shape: Sequence[int] | None) -> list[int]:
    return [int(v) for v in kernel_shape] if kernel_shape else list(w.shape[2:])


def conv_out_size(size: Any, k: int, s: int, d: int, pb: int, pe: int) -> Any:
    if not isinstance(size, int):
        return None
    return (size + pb + pe - (k - 1) * d - 1) // s + 1


# ---------------------------------------------------------------------------------------- shape fns


def conv_shape(node: Any) -> list[tuple[Any, Any]]:
    x, w = node.inputs[0], node.inputs[1]
    dt = x.dtype
    if node.op_type in ("ConvInteger",):
        from shapeplan.ir.dtypes import dtype as as_dtype
        dt = as_dtype("int32")
    elif node.op_type == "QLinearConv":
        dt = node.inputs[7].dtype if len(node.inputs) > 7 and node.inputs[7] is not None else x.dtype
        w = node.inputs[3]
    if x.shape is None or w.shape is None:
        return [(dt, None)]
    n = len(x.shape) - 2
    a = node.attrs
    k = [int(v) for v in a.get("kernel_shape") or w.shape[2:]]
    if not all(isinstance(v, int) for v in k):
        return [(dt, None)]
    k, s, d = spatial_attrs(n, k, a.get("strides"), a.get("dilations"))
    sizes = list(x.shape[2:])
    auto_pad = a.get("auto_pad", "NOTSET")
    out = []
    for i in range(n):
        if not isinstance(sizes[i], int):
            out.append(None)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-sizes[i] // s[i]))
        else:
            pads = resolve_pads(auto_pad, [1] * n, k, s, d, a.get("pads"))
            out.append(conv_out_size(sizes[i], k[i], s[i], d[i], pads[i], pads[i + n]))
    return [(dt, (x.shape[0], w.shape[0], *out))]


# ---------------------------------------------------------------------------------------- Conv


@register("Conv", since=1, shape=conv_shape)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None):
    """ONNX Conv (1-3 spatial dims, groups, dilations, asymmetric pads, auto_pad)."""
    n = x.dim() - 2
    k, s, d = spatial_attrs(n, _kernel_shape(w, kernel_shape), strides, dilations)
    p = resolve_pads(auto_pad, list(x.shape[2:]), k, s, d, pads)
    return conv_nd(x, w, b, s, d, group, p)


@register("ConvInteger", since=10, shape=conv_shape)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None,
                 group=1, kernel_shape=None, pads=None, strides=None):
    """ONNX ConvInteger: (x - x_zp) conv (w - w_zp), accumulated exactly in int32."""
    n = x.dim() - 2
    k, s, d = spatial_attrs(n, _kernel_shape(w, kernel_shape), strides, dilations)
    p = resolve_pads(auto_pad, list(x.shape[2:]), k, s, d, pads)
    xf = x.to(torch.float64)
    wf = w.to(torch.float64)
    if x_zero_point is not None:
        xf = xf - x_zero_point.to(torch.float64)
    if w_zero_point is not None:
        wzp = w_zero_point.to(torch.float64)
        wf = wf - (wzp.reshape(-1, *[1] * (w.dim() - 1)) if wzp.numel() > 1 else wzp)
    # padding happens after zero-point subtraction: padded cells contribute 0
    y = conv_nd(xf, wf, None, s, d, group, p)
    return y.round().to(torch.int32)


def _saturate_round(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.round(y).clamp(info.min, info.max).to(dtype)


def _per_channel(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A scalar stays scalar; a [C] vector broadcasts along axis 1 of a rank-``rank`` tensor."""
    return t.reshape(1, -1, *[1] * (rank - 2)) if t.numel() > 1 else t.reshape(())


@register("QLinearConv", since=10, shape=conv_shape)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ONNX QLinearConv: integer conv with zero points, rescaled and saturated to y's type."""
    n = x.dim() - 2
    k, s, d = spatial_attrs(n, _kernel_shape(w, kernel_shape), strides, dilations)
    p = resolve_pads(auto_pad, list(x.shape[2:]), k, s, d, pads)
    xf = x.to(torch.float64) - x_zero_point.to(torch.float64)
    wzp = w_zero_point.to(torch.float64)
    wf = w.to(torch.float64) - (wzp.reshape(-1, *[1] * (w.dim() - 1)) if wzp.numel() > 1 else wzp)
    acc = conv_nd(xf, wf, None, s, d, group, p)          # [N, M, *out]
    if b is not None:
        acc = acc + b.to(torch.float64).reshape(1, -1, *[1] * n)
    scale = x_scale.to(torch.float64) * _per_channel(w_scale.to(torch.float64), acc.dim())
    y = acc * scale / y_scale.to(torch.float64) + y_zero_point.to(torch.float64)
    return _saturate_round(y, y_zero_point.dtype)


# ---------------------------------------------------------------------------------------- ConvTranspose


def _conv_transpose_pads(auto_pad: str, in_sizes: Sequence[int], k: Sequence[int], s: Sequence[int],
                         d: Sequence[int], pads: Sequence[int] | None, output_padding: Sequence[int],
                         output_shape: Sequence[int] | None) -> list[int]:
    n = len(in_sizes)
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [in_sizes[i] * s[i] for i in range(n)]
    if output_shape is None:
        return [int(p) for p in pads] if pads else [0] * (2 * n)
    output_shape = list(output_shape)[-n:]
    begin, end = [], []
    for i in range(n):
        total = s[i] * (in_sizes[i] - 1) + output_padding[i] + (k[i] - 1) * d[i] + 1 - output_shape[i]
        if auto_pad == "SAME_UPPER":
            begin.append(total // 2)
            end.append(total - total // 2)
        else:
            begin.append(total - total // 2)
            end.append(total // 2)
    return begin + end


@register("ConvTranspose", since=1)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    """ONNX ConvTranspose: full transposed conv, then crop pads / grow output_padding."""
    n = x.dim() - 2
    k, s, d = spatial_attrs(n, _kernel_shape(w, kernel_shape), strides, dilations)
    op = [int(v) for v in output_padding] if output_padding else [0] * n
    p = _conv_transpose_pads(auto_pad, list(x.shape[2:]), k, s, d, pads, op, output_shape)
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[n]
    y = fn(x, w, None, s, 0, 0, group, d)        # full output: s*(in-1) + (k-1)*d + 1
    crop = [-p[i] for i in range(n)] + [op[i] - p[i + n] for i in range(n)]
    y = pad_spatial(y, crop)
    if b is not None:
        y = y + b.reshape(1, -1, *[1] * n)
    return y


# ---------------------------------------------------------------------------------------- DeformConv


def _bilinear_gather(x: torch.Tensor, py: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
    """Sample ``x`` [N, G, Cg, H, W] at float coords py/px [N, G, K, OH, OW] with zero outside.

    Returns [N, G, Cg, K, OH, OW].
    """
    N, G, Cg, H, W = x.shape
    y0, x0 = torch.floor(py), torch.floor(px)
    out = None
    flat = x.reshape(N, G, Cg, H * W)
    for dy in (0, 1):
        for dx in (0, 1):
            yy, xx = y0 + dy, x0 + dx
            wgt = (1 - (py - yy).abs()) * (1 - (px - xx).abs())        # [N, G, K, OH, OW]
            valid = (yy >= 0) & (yy <= H - 1) & (xx >= 0) & (xx <= W - 1)
            wgt = torch.where(valid, wgt, torch.zeros_like(wgt))
            idx = (yy.clamp(0, H - 1) * W + xx.clamp(0, W - 1)).long()  # [N, G, K, OH, OW]
            g = torch.gather(flat, 3, idx.reshape(N, G, 1, -1).expand(N, G, Cg, idx[0, 0].numel()))
            term = g.reshape(N, G, Cg, *idx.shape[2:]) * wgt.unsqueeze(2)
            out = term if out is None else out + term
    return out  # type: ignore[return-value]


@register("DeformConv", since=19)
def deform_conv(x, w, offset, b=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                offset_group=1, pads=None, strides=None):
    """ONNX DeformConv (2-D): bilinear sampling at offset kernel taps, optional modulation mask."""
    N, C, H, W = x.shape
    M = w.shape[0]
    k, s, d = spatial_attrs(2, _kernel_shape(w, kernel_shape), strides, dilations)
    p = [int(v) for v in pads] if pads else [0] * 4
    oh = (H + p[0] + p[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (W + p[1] + p[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    K = k[0] * k[1]
    G = offset_group
    dt = x.dtype
    dev = x.device
    # base sampling grid: [K, OH, OW]
    ky, kx = torch.meshgrid(torch.arange(k[0], device=dev), torch.arange(k[1], device=dev), indexing="ij")
    base_y = (torch.arange(oh, device=dev) * s[0] - p[0]).reshape(1, oh, 1) + (ky.reshape(K, 1, 1) * d[0])
    base_x = (torch.arange(ow, device=dev) * s[1] - p[1]).reshape(1, 1, ow) + (kx.reshape(K, 1, 1) * d[1])
    off = offset.reshape(N, G, K, 2, oh, ow)
    py = base_y.to(dt) + off[:, :, :, 0]
    px = base_x.to(dt) + off[:, :, :, 1]
    cols = _bilinear_gather(x.reshape(N, G, C // G, H, W), py, px)     # [N, G, C/G, K, OH, OW]
    if mask is not None:
        cols = cols * mask.reshape(N, G, 1, K, oh, ow)
    cols = cols.reshape(N, group, C // group, K, oh, ow)
    wg = w.reshape(group, M // group, C // group, K)
    y = torch.einsum("ngckhw,gmck->ngmhw", cols, wg).reshape(N, M, oh, ow)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return y


# ---------------------------------------------------------------------------------------- LRN


@register("LRN", since=1)
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size=1):
    """ONNX LRN: x / (bias + alpha/size * sum of squares over a channel window) ** beta."""
    front, back = (size - 1) // 2, math.ceil((size - 1) / 2)
    sq = (x * x).transpose(1, -1)                                  # channels last for F.pad
    sq = F.pad(sq, [front, back]).transpose(1, -1)
    window = sq.unfold(1, size, 1).sum(-1)                         # [N, C, *spatial]
    return x / (bias + (alpha / size) * window) ** beta
