"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12+).

Input [N, C, d1..dk], labels [N, d1..dk]. ``reduction`` none | sum | mean; with a class ``weight``
or an ``ignore_index`` the mean is sum(loss) / sum(effective weights), as in the ONNX reference.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ShapeError
from shapeplan.ops.registry import Trait, register

_LOW = (torch.float16, torch.bfloat16)


def nll(logp: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: str,
        ignore_index: int | None) -> torch.Tensor:
    """Weighted negative log-likelihood of ``logp`` [N, C, ...] at ``target`` [N, ...]."""
    if logp.dim() < 2:
        raise ShapeError(f"NegativeLogLikelihoodLoss: input must be [N, C, ...], got shape {list(logp.shape)}")
    t = target.to(torch.int64)
    valid = torch.ones_like(t, dtype=torch.bool) if ignore_index is None else t != ignore_index
    tc = torch.where(valid, t, torch.zeros_like(t)).clamp(0, logp.shape[1] - 1)
    picked = -torch.gather(logp, 1, tc.unsqueeze(1)).squeeze(1)            # [N, d1..dk]
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    picked = torch.where(valid, picked, zero)
    if weight is None and ignore_index is None:
        w = None
    else:
        w = weight.to(logp.dtype)[tc] if weight is not None else torch.ones_like(picked)
        w = torch.where(valid, w, zero)
        picked = picked * w
    if reduction == "none":
        return picked
    if reduction == "sum":
        return picked.sum()
    if reduction == "mean":
        return picked.sum() / w.sum() if w is not None else picked.mean()
    raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")


def _loss_shape(node: Any) -> list:
    x, t = node.inputs[0], node.inputs[1]
    red = node.attrs.get("reduction", "mean")
    out = [(x.dtype, (t.shape if red == "none" else ()))]
    if len(node.outputs) > 1:
        out.append((x.dtype, x.shape))
    return out


@register("NegativeLogLikelihoodLoss", since=12, traits=Trait.REDUCTION, shape=_loss_shape)
def negative_log_likelihood_loss(input, target, weight=None, *, reduction="mean", ignore_index=None):  # noqa: A002
    """ONNX NegativeLogLikelihoodLoss: -input[n, target[n, ...], ...] (times weight[target])."""
    x = input.float() if input.dtype in _LOW else input
    return nll(x, target, weight, reduction, ignore_index).to(input.dtype)


@register("SoftmaxCrossEntropyLoss", since=12, traits=Trait.REDUCTION, shape=_loss_shape)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, reduction="mean", ignore_index=None,
                               _n_out=1):
    """ONNX SoftmaxCrossEntropyLoss: NLL of log_softmax(scores, axis=1); second output log_prob."""
    x = scores.float() if scores.dtype in _LOW else scores
    logp = torch.log_softmax(x, dim=1)
    loss = nll(logp, labels, weights, reduction, ignore_index).to(scores.dtype)
    if _n_out > 1:
        return loss, logp.to(scores.dtype)
    return loss
