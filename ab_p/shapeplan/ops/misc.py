"""Odd ops that belong to no family: CausalConvWithState (opset 27).

ImageDecoder is not implemented: decoding JPEG/PNG/WebP/... would need an image library
(PIL/OpenCV) that shapeplan does not depend on.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shapeplan.ops.registry import register


def _causal_shape(node: Any) -> list[tuple[Any, Any]]:
    x, w = node.inputs[0], node.inputs[1]
    if x.shape is None or w.shape is None or not isinstance(w.shape[-1], int):
        return [(x.dtype, x.shape), (x.dtype, None)]
    return [(x.dtype, x.shape), (x.dtype, (x.shape[0], x.shape[1], w.shape[-1] - 1))]


@register("CausalConvWithState", since=27, shape=_causal_shape)
def causal_conv_with_state(x, weight, bias=None, past_state=None, *, activation="none"):
    """Depthwise causal 1-D conv over [past_state | x]; returns (y, the last k-1 positions)."""
    B, C, _ = x.shape                                              # [B, C, L]
    k = weight.shape[-1]
    if past_state is None:
        past_state = torch.zeros((B, C, k - 1), dtype=x.dtype, device=x.device)
    full = torch.cat([past_state.to(x.dtype), x], dim=-1)          # [B, C, k-1+L]
    y = F.conv1d(full, weight.to(x.dtype), None if bias is None else bias.to(x.dtype), groups=C)
    if activation.lower() in ("silu", "swish"):
        y = y * torch.sigmoid(y)
    present = full[..., full.shape[-1] - (k - 1):] if k > 1 else full[..., :0]
    return y, present
