"""Block rearrangement (ONNX semantics): DepthToSpace / SpaceToDepth move channel blocks into the
spatial dims and back; Col2Im sums sliding blocks [N, C*prod(block), L] back into an image."""
from __future__ import annotations

import math
from typing import Any

import torch

from shapeplan.errors import ExecutionError
from shapeplan.ops._common import ints
from shapeplan.ops.registry import Trait, register

VDS = Trait.VALUE_DEPENDENT_SHAPE


# ----------------------------------------------------------------------------- DepthToSpace / SpaceToDepth
def _d2s_shape(node: Any) -> list:
    x, b = node.inputs[0], node.attrs["blocksize"]
    if x.shape is None:
        return [(x.dtype, None)]
    n, c, h, w = x.shape
    f = lambda d, k: d * k if isinstance(d, int) else None  # noqa: E731
    g = lambda d, k: d // k if isinstance(d, int) else None  # noqa: E731
    if node.op_type == "DepthToSpace":
        return [(x.dtype, (n, g(c, b * b), f(h, b), f(w, b)))]
    return [(x.dtype, (n, f(c, b * b), g(h, b), g(w, b)))]


@register("DepthToSpace", since=1, shape=_d2s_shape)
def depth_to_space(x, *, blocksize, mode="DCR"):
    """ONNX DepthToSpace (DCR or CRD). x: [N, C, H, W] -> [N, C/b², H*b, W*b]."""
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth", since=1, shape=_d2s_shape)
def space_to_depth(x, *, blocksize, mode="DCR"):
    """ONNX SpaceToDepth (DCR, or CRD from opset 28). x: [N, C, H, W] -> [N, C*b², H/b, W/b]."""
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


# ----------------------------------------------------------------------------- Col2Im
@register("Col2Im", since=18, traits=VDS, host_inputs=(1, 2))
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im: sum sliding blocks [N, C*prod(block), L] back into an image [N, C, *image]."""
    img, blk = ints(image_shape), ints(block_shape)
    nd = len(img)
    dil = dilations or [1] * nd
    st = strides or [1] * nd
    pd = pads or [0] * (2 * nd)
    padded = [img[i] + pd[i] + pd[i + nd] for i in range(nd)]
    nblk = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    n, ck, length = x.shape
    c = ck // math.prod(blk)
    if length != math.prod(nblk):
        raise ExecutionError(f"Col2Im: input has {length} blocks, image/block/strides give {nblk}")
    dev = x.device
    # padded-image coordinate of (kernel offset k, block position l) per dim: l*stride + k*dilation
    lin = torch.zeros((), dtype=torch.int64, device=dev)
    for i in range(nd):
        k = torch.arange(blk[i], device=dev) * dil[i]
        lpos = torch.arange(nblk[i], device=dev) * st[i]
        coord = k.view(-1, 1) + lpos.view(1, -1)                       # [k_i, l_i]
        shape_k = [1] * (2 * nd)
        shape_k[i], shape_k[nd + i] = blk[i], nblk[i]
        lin = lin * padded[i] + coord.reshape(shape_k)
    lin = lin.reshape(-1)                                              # [prod(k) * prod(l)]
    out = torch.zeros(n, c, math.prod(padded), dtype=x.dtype, device=dev)
    out.index_add_(2, lin, x.reshape(n, c, -1))
    out = out.reshape(n, c, *padded)
    crop = tuple(slice(pd[i], pd[i] + img[i]) for i in range(nd))
    return out[(slice(None), slice(None)) + crop].contiguous()
