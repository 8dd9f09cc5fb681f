"""Normalizations: BatchNormalization (all opset forms), InstanceNormalization,
GroupNormalization (opset 18 per-group vs opset 21 per-channel affine), MeanVarianceNormalization,
LpNormalization. (LayerNormalization / RMSNormalization live in ops/attention.py.)"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from shapeplan.ops.registry import register
from shapeplan.ops.shape_fns import same_as


def _chan(t: torch.Tensor, rank: int) -> torch.Tensor:
    """[C] -> [1, C, 1, ...] for broadcasting over a rank-``rank`` channels-first tensor."""
    return t.reshape(1, -1, *[1] * (rank - 2))


def _affine_param(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # spatial=0 (opset < 9) gives per-activation parameters of shape x.shape[1:]
    if t.dim() > 1 or (t.numel() != x.shape[1] and t.numel() == math.prod(x.shape[1:])):
        return t.reshape(1, *x.shape[1:])
    return _chan(t, x.dim())


def _bn_shape(node: Any) -> list[tuple[Any, Any]]:
    x, scale = node.inputs[0], node.inputs[1]
    out = [(x.dtype, x.shape)]
    for _ in node.outputs[1:]:
        out.append((scale.dtype if scale is not None else x.dtype, scale.shape if scale is not None else None))
    return out


@register("BatchNormalization", since=1, shape=_bn_shape)
def batch_norm(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1,
               is_test=0, consumed_inputs=None, _opset=15, _n_out=1):
    """ONNX BatchNormalization.

    Inference (the usual case): y = scale * (x - mean) / sqrt(var + eps) + b.
    Training (opset >= 14 with training_mode=1, or older opsets asked for the extra outputs):
    normalize with the batch statistics and also return running statistics
    (opset >= 14: y, running_mean, running_var; opset < 14: y, mean, var, saved_mean, saved_var).
    """
    training = bool(training_mode) if _opset >= 14 else (_n_out > 1 and not is_test)
    if not training:
        if all(t.dim() == 1 and t.numel() == x.shape[1] for t in (scale, b, mean, var)) and \
                x.dtype in (torch.float32, torch.float64) and all(t.dtype == x.dtype for t in (scale, b, mean, var)):
            return F.batch_norm(x, mean, var, scale, b, False, 0.0, epsilon)   # one fused pass
        inv = torch.rsqrt(_affine_param(var, x) + epsilon)
        return (x - _affine_param(mean, x)) * inv * _affine_param(scale, x) + _affine_param(b, x)
    axes = [0] + list(range(2, x.dim()))
    bmean = x.mean(axes)
    bvar = x.var(axes, unbiased=False)
    y = (x - _chan(bmean, x.dim())) * torch.rsqrt(_chan(bvar, x.dim()) + epsilon) \
        * _chan(scale, x.dim()) + _chan(b, x.dim())
    run_mean = mean * momentum + bmean * (1 - momentum)
    run_var = var * momentum + bvar * (1 - momentum)
    if _opset >= 14:
        return (y, run_mean, run_var)[:_n_out]
    return (y, run_mean, run_var, bmean, bvar)[:_n_out]


@register("InstanceNormalization", since=1, shape=same_as(0))
def instance_norm(x, scale, b, *, epsilon=1e-5):
    """ONNX InstanceNormalization: per-(n, c) normalization over the spatial dims."""
    axes = tuple(range(2, x.dim()))
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    mean = xf.mean(axes, keepdim=True)
    var = xf.var(axes, unbiased=False, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + epsilon)
    return (y * _chan(scale.to(y.dtype), x.dim()) + _chan(b.to(y.dtype), x.dim())).to(x.dtype)


def _group_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, epsilon: float, num_groups: int,
                per_channel: bool, stash_float: bool) -> torch.Tensor:
    N, C = x.shape[:2]
    xf = x.float() if stash_float and x.dtype != torch.float64 else x
    g = xf.reshape(N, num_groups, -1)                              # [N, G, C/G * spatial]
    mean = g.mean(-1, keepdim=True)
    var = g.var(-1, unbiased=False, keepdim=True)
    y = ((g - mean) * torch.rsqrt(var + epsilon)).reshape(x.shape).to(x.dtype)
    if not per_channel:                                            # opset 18: one (scale, bias) per group
        scale = scale.repeat_interleave(C // num_groups)
        bias = bias.repeat_interleave(C // num_groups)
    return y * _chan(scale, x.dim()) + _chan(bias, x.dim())


@register("GroupNormalization", since=18, shape=same_as(0))
def group_norm_18(x, scale, bias, *, epsilon=1e-5, num_groups=1):
    """ONNX GroupNormalization-18: scale and bias have one entry per group."""
    return _group_norm(x, scale, bias, epsilon, num_groups, per_channel=False, stash_float=False)


@register("GroupNormalization", since=21, shape=same_as(0))
def group_norm_21(x, scale, bias, *, epsilon=1e-5, num_groups=1, stash_type=1):
    """ONNX GroupNormalization-21: scale and bias have one entry per channel."""
    return _group_norm(x, scale, bias, epsilon, num_groups, per_channel=True, stash_float=stash_type == 1)


@register("MeanVarianceNormalization", since=9, shape=same_as(0))
def mean_variance_norm(x, *, axes=(0, 2, 3)):
    """ONNX MVN: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9), as the ONNX function body defines it."""
    axes = tuple(int(a) for a in axes)
    mean = x.mean(axes, keepdim=True)
    var = (x * x).mean(axes, keepdim=True) - mean * mean
    return (x - mean) / (torch.sqrt(var) + 1e-9)


@register("LpNormalization", since=1, shape=same_as(0))
def lp_normalization(x, *, axis=-1, p=2):
    """ONNX LpNormalization: x / ||x||_p along ``axis``; a zero norm gives 0, not NaN."""
    if p == 1:
        norm = x.abs().sum(axis, keepdim=True)
    else:
        norm = torch.sqrt((x * x).sum(axis, keepdim=True))
    return torch.where(norm == 0, torch.zeros_like(x), x / norm)
