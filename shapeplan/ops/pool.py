"""Pooling: MaxPool (with Indices), AveragePool, LpPool, their Global forms, MaxUnpool.

One windowing routine serves every pool: pad the input, view the (dilated) windows with
``Tensor.unfold`` (no copy), reduce over the window axes. It implements ONNX's rules for
ceil_mode (the last window must start inside the input or its begin pad), count_include_pad
(explicit pads count, the extra ceil-mode tail never does) and auto_pad.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops.nn import pad_spatial, resolve_pads, spatial_attrs
from shapeplan.ops.registry import register


def pool_geometry(in_sizes: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int],
                  auto_pad: str, pads: Sequence[int] | None, ceil_mode: int) -> tuple[list[int], list[int]]:
    """(output sizes, begin+end pads) for a pooling window."""
    n = len(in_sizes)
    p = resolve_pads(auto_pad, in_sizes, k, s, d, pads)
    out = []
    for i in range(n):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-in_sizes[i] // s[i]))
            continue
        span = in_sizes[i] + p[i] + p[i + n] - (k[i] - 1) * d[i] - 1
        if ceil_mode:
            o = -(-span // s[i]) + 1
            if (o - 1) * s[i] >= in_sizes[i] + p[i]:     # last window would start in the end pad
                o -= 1
        else:
            o = span // s[i] + 1
        out.append(o)
    return out, p


def _end_extents(x: torch.Tensor, out: Sequence[int], pads: Sequence[int], k: Sequence[int],
                 s: Sequence[int], d: Sequence[int]) -> list[int]:
    """Per spatial dim, the end padding that makes the last window fit exactly (negative: a crop)."""
    n = len(out)
    return [pads[i + n] + (out[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 - (x.shape[2 + i] + pads[i] + pads[i + n])
            for i in range(n)]


def _windows(x: torch.Tensor, out: Sequence[int], pads: Sequence[int], k: Sequence[int],
             s: Sequence[int], d: Sequence[int], fill: float) -> torch.Tensor:
    """[N, C, *out, *k] view of the dilated windows of ``x`` padded with ``fill``."""
    n = len(out)
    xp = pad_spatial(x, list(pads[:n]) + _end_extents(x, out, pads, k, s, d), fill)
    for i in range(n):
        eff = (k[i] - 1) * d[i] + 1
        xp = xp.unfold(2 + i, eff, s[i])           # appends a window axis of size eff
    if any(v != 1 for v in d):
        idx = tuple([slice(None)] * (2 + n) + [slice(None, None, dv) for dv in d])
        xp = xp[idx]
    return xp


def _torch_pads(pads: Sequence[int], ext: Sequence[int], k: Sequence[int]) -> bool:
    """Whether torch's own (symmetric) padding gives the windows of ``_windows``: the begin pads equal the
    end extents and fit torch's rule (at most half the kernel)."""
    return all(pads[i] == ext[i] >= 0 and 2 * pads[i] <= k[i] for i in range(len(ext)))


def _torch_pool(pools: dict, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``pools[spatial dims](x, ...)``; a 2-D pool on the CPU through channels-last planes, where torch's
    CPU kernels are ~4x faster, the copies included (2 vCPUs, MaxPool [1, 64, 112, 112]: 6.3 -> 1.5 ms):
    the result comes back contiguous, as the windowing's."""
    n = x.dim() - 2
    if n == 2 and x.device.type == "cpu":
        return pools[2](x.contiguous(memory_format=torch.channels_last), *args, **kwargs).contiguous()
    return pools[n](x, *args, **kwargs)


def _lowest(dtype: torch.dtype) -> float:
    if dtype.is_floating_point:
        return float("-inf")
    if dtype == torch.bool:
        return 0
    return torch.iinfo(dtype).min


def _setup(x: torch.Tensor, kernel_shape: Sequence[int], strides: Any, dilations: Any, auto_pad: str,
           pads: Any, ceil_mode: int) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    n = x.dim() - 2
    k, s, d = spatial_attrs(n, kernel_shape, strides, dilations)
    out, p = pool_geometry(list(x.shape[2:]), k, s, d, auto_pad, pads, ceil_mode)
    return k, s, d, out, p


def pool_shape(node: Any) -> list[tuple[Any, Any]]:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None)] * len(node.outputs)
    n = len(x.shape) - 2
    a = node.attrs
    sizes = list(x.shape[2:])
    k = a.get("kernel_shape")
    if not all(isinstance(v, int) for v in sizes):
        shape = (*x.shape[:2], *[None] * n)
    else:
        k, s, d = spatial_attrs(n, k, a.get("strides"), a.get("dilations"))
        out, _ = pool_geometry(sizes, k, s, d, a.get("auto_pad", "NOTSET"), a.get("pads"), a.get("ceil_mode", 0))
        shape = (*x.shape[:2], *out)
    res = [(x.dtype, shape)]
    if len(node.outputs) > 1:
        res.append((as_dtype("int64"), shape))
    return res


def global_shape(node: Any) -> list[tuple[Any, Any]]:
    x = node.inputs[0]
    if x.shape is None:
        return [(x.dtype, None)]
    return [(x.dtype, (*x.shape[:2], *[1] * (len(x.shape) - 2)))]


# ---------------------------------------------------------------------------------------- MaxPool


@register("MaxPool", since=1, shape=pool_shape)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), pads=None,
             storage_order=0, strides=None, _n_out=1):
    """ONNX MaxPool, incl. the Indices output (flat index into x, row- or column-major)."""
    n = x.dim() - 2
    k, s, d, out, p = _setup(x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    if _n_out < 2 and x.dtype.is_floating_point and 1 <= n <= 3:
        # torch's pooling kernel over the same windows: no [.., *out, *k] copy of the windows (ResNet-50's
        # stem pool: 9x its input), and the same values (a max is exact; NaN propagates in both)
        ext = _end_extents(x, out, p, k, s, d)
        if _torch_pads(p, ext, k):
            return _torch_pool(_MAX_POOL, x, k, s, list(p[:n]), d)
        return _torch_pool(_MAX_POOL, pad_spatial(x, list(p[:n]) + ext, float("-inf")), k, s, 0, d)
    win = _windows(x, out, p, k, s, d, _lowest(x.dtype))
    flat = win.reshape(*win.shape[:2 + n], -1)
    if _n_out < 2:
        return flat.amax(-1)
    values, arg = flat.max(-1)
    # index of each input cell in x, padded with -1 like x, windowed the same way
    N, C, *sizes = x.shape
    spatial = torch.arange(math.prod(sizes), device=x.device, dtype=torch.int64).reshape(sizes)
    if storage_order:
        spatial = torch.arange(math.prod(sizes), device=x.device, dtype=torch.int64) \
            .reshape(list(reversed(sizes))).permute(*reversed(range(n)))
    iwin = _windows(spatial.reshape(1, 1, *sizes), out, p, k, s, d, -1)
    iflat = iwin.reshape(1, 1, *out, -1).expand(N, C, *out, iwin[0, 0].numel() // math.prod(out))
    idx = torch.gather(iflat, -1, arg.unsqueeze(-1)).squeeze(-1)
    base = torch.arange(N * C, device=x.device, dtype=torch.int64).reshape(N, C, *[1] * n) * math.prod(sizes)
    return values, idx + base


_MAX_POOL = {1: torch.nn.functional.max_pool1d, 2: torch.nn.functional.max_pool2d, 3: torch.nn.functional.max_pool3d}

# ---------------------------------------------------------------------------------------- AveragePool / LpPool


def _avg_pool_core(x: torch.Tensor, k, s, d, out, p, count_include_pad: int) -> torch.Tensor:  # noqa: ANN001
    n = x.dim() - 2
    axes = tuple(range(-n, 0))
    total = _windows(x, out, p, k, s, d, 0.0).sum(axes)
    # divisor: cells of each window inside the input (or inside input + explicit pads)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device)
    if count_include_pad:
        ones = pad_spatial(ones, p, 1.0)
        p = [0] * (2 * n)
    count = _windows(ones, out, p, k, s, d, 0.0).sum(axes)
    return total / count


@register("AveragePool", since=1, shape=pool_shape)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=(), pads=None, strides=None):
    """ONNX AveragePool."""
    k, s, d, out, p = _setup(x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    n = x.dim() - 2
    if x.dtype.is_floating_point and 1 <= n <= 3 and all(v == 1 for v in d) and \
            (n < 3 or x.device.type != "cpu" or x.dtype in (torch.float32, torch.float64)):   # no 16-bit 3-D CPU kernel
        # torch's pooling kernel where its padding gives ONNX's windows and divisors: symmetric begin /
        # end extents within its rule, and with count_include_pad no ceil-mode tail (torch would count it,
        # ONNX never does); the windowing's sum and count otherwise. 3-14x faster on the CPU (Inception's
        # 3x3 pools); the sums' order differs, so the last bit may.
        ext = _end_extents(x, out, p, k, s, d)
        if _torch_pads(p, ext, k) and all((not count_include_pad or ext[i] <= p[i + n]) and
                                          x.shape[2 + i] >= k[i] for i in range(n)):   # (torch's 3-D CPU kernel wants it)
            return _torch_pool(_AVG_POOL, x, k, s, list(p[:n]), count_include_pad=bool(count_include_pad))
    return _avg_pool_core(x, k, s, d, out, p, count_include_pad)


_AVG_POOL = {1: torch.nn.functional.avg_pool1d, 2: torch.nn.functional.avg_pool2d, 3: torch.nn.functional.avg_pool3d}


@register("LpPool", since=1, shape=pool_shape)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), p=2, pads=None,
            strides=None):
    """ONNX LpPool: (sum |x|^p over the window) ^ (1/p)."""
    n = x.dim() - 2
    k, s, d, out, pd = _setup(x, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode)
    win = _windows(x.abs() ** p, out, pd, k, s, d, 0.0)
    return win.sum(tuple(range(-n, 0))) ** (1.0 / p)


# ---------------------------------------------------------------------------------------- Global pools


@register("GlobalAveragePool", since=1, shape=global_shape)
def global_average_pool(x):
    return x.mean(tuple(range(2, x.dim())), keepdim=True)


@register("GlobalMaxPool", since=1, shape=global_shape)
def global_max_pool(x):
    return x.amax(tuple(range(2, x.dim())), keepdim=True)


@register("GlobalLpPool", since=2, shape=global_shape)
def global_lp_pool(x, *, p=2):
    return (x.abs() ** p).sum(tuple(range(2, x.dim())), keepdim=True) ** (1.0 / p)


# ---------------------------------------------------------------------------------------- MaxUnpool


@register("MaxUnpool", since=9)
def max_unpool(x, indices, output_shape=None, *, kernel_shape=(), pads=None, strides=None):
    """ONNX MaxUnpool: scatter x into zeros at the flat indices MaxPool produced."""
    n = x.dim() - 2
    k, s, _ = spatial_attrs(n, kernel_shape, strides, None)
    p = [int(v) for v in pads] if pads else [0] * (2 * n)
    inferred = [*x.shape[:2], *[(x.shape[2 + i] - 1) * s[i] + k[i] - p[i] - p[i + n] for i in range(n)]]
    y = torch.zeros(math.prod(inferred), dtype=x.dtype, device=x.device)
    y.scatter_(0, indices.reshape(-1).to(torch.int64), x.reshape(-1))
    y = y.reshape(inferred)
    if output_shape is not None:            # the inferred block sits at the origin of a larger output
        shape = [int(v) for v in output_shape.tolist()]
        y = pad_spatial(y, [0] * n + [shape[2 + i] - inferred[2 + i] for i in range(n)])
    return y



