"""Transformer building blocks: normalizations, rotary embedding, gated activations.

ONNX ops: LayerNormalization (17), RMSNormalization (23), RotaryEmbedding (23), SwiGLU (28).
The "shapeplan" domain re-registers RMSNormalization and RotaryEmbedding (since=1, ONNX-23
semantics) and adds two fused ops that the LLM builder and the fusion passes emit:

* ``shapeplan::SkipRMSNormalization(x, skip, scale) -> (normed, x + skip)``
* ``shapeplan::SiluMul(gate, up) -> silu(gate) * up``  (or ``SiluMul(x)``: x split in halves
  along the last axis, first half is the gate, as in vLLM's ``SiluAndMul``)

Every kernel is device-agnostic (it creates nothing on a fixed device) and every op has a symbolic
shape function, because these ops sit in LLM graphs with symbolic batch / sequence dims.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import DType, dtype as as_dtype
from shapeplan.ir.graph import Dim, Shape
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import same_as

# ----------------------------------------------------------------- symbolic dim arithmetic
# Dims are ints, symbolic names (str) or None. Derived symbolic dims are spelled as expressions
# ("past+seq", "hidden/8") so that two values derived the same way compare equal.


def dim_add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a is None or b is None:
        return None
    if a == 0:
        return b
    if b == 0:
        return a
    return f"{a}+{b}"


def dim_div(a: Dim, n: int | None) -> Dim:
    if a is None or n is None:
        return None
    if isinstance(a, int):
        return a // n
    return a if n == 1 else f"{a}/{n}"


def dim_mul(a: Dim, n: Dim) -> Dim:
    if isinstance(a, int) and isinstance(n, int):
        return a * n
    if a is None or n is None:
        return None
    if a == 1:
        return n
    if n == 1:
        return a
    return f"{a}*{n}"


def norm_axis(axis: int, rank: int, what: str) -> int:
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise ShapeError(f"{what}: axis {axis} is out of range for an input of rank {rank}")
    return ax


_STASH = {1: torch.float32, 11: torch.float64, 16: torch.bfloat16, 10: torch.float16}


def _stash_dtype(stash_type: int, what: str) -> torch.dtype:
    if stash_type not in _STASH:
        raise ValueError(f"{what}: stash_type {stash_type} is not a floating-point ONNX type "
                         f"(expected one of {sorted(_STASH)})")
    return _STASH[stash_type]


# ----------------------------------------------------------------- LayerNormalization


def _layer_norm_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    x = node.inputs[0]
    stash = as_dtype(_stash_dtype(node.attrs.get("stash_type", 1), node.describe()))
    if x.shape is None:
        return [(x.dtype, None), (stash, None), (stash, None)][:len(node.outputs)]
    ax = norm_axis(node.attrs.get("axis", -1), len(x.shape), f"node {node.describe()}")
    stat = tuple(x.shape[:ax]) + (1,) * (len(x.shape) - ax)
    return [(x.dtype, x.shape), (stash, stat), (stash, stat)][:len(node.outputs)]


@register("LayerNormalization", since=17, traits=Trait.REDUCTION, shape=_layer_norm_shape)
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, _n_out=1):
    """Y = (X - mean) / sqrt(var + eps) * Scale + B over axes [axis, rank); Mean and InvStdDev
    (stash type, keepdims shape) are the optional 2nd and 3rd outputs."""
    ax = norm_axis(axis, x.dim(), "LayerNormalization")
    dims = tuple(range(ax, x.dim()))
    xu = x.to(_stash_dtype(stash_type, "LayerNormalization"))
    var, mean = torch.var_mean(xu, dim=dims, unbiased=False, keepdim=True)
    inv_std = torch.rsqrt(var + epsilon)
    y = ((xu - mean) * inv_std).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    if _n_out == 1:
        return y
    return (y, mean, inv_std)[:_n_out]


# ----------------------------------------------------------------- RMSNormalization


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, axis: int, epsilon: float, stash_type: int,
              what: str) -> torch.Tensor:
    ax = norm_axis(axis, x.dim(), what)
    xu = x.to(_stash_dtype(stash_type, what))
    ms = xu.square().mean(dim=tuple(range(ax, x.dim())), keepdim=True)
    return (xu * torch.rsqrt(ms + epsilon)).to(x.dtype) * scale


@register("RMSNormalization", since=23, traits=Trait.REDUCTION, shape=same_as(0))
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Y = X / sqrt(mean(X^2 over axes [axis, rank)) + eps) * Scale, normalized in stash type."""
    return _rms_norm(x, scale, axis, epsilon, stash_type, "RMSNormalization")


register("RMSNormalization", domain="shapeplan", since=1, traits=Trait.REDUCTION,
         shape=same_as(0))(rms_normalization)


@register("SkipRMSNormalization", domain="shapeplan", since=1, traits=Trait.REDUCTION,
          shape=same_as(0))
def skip_rms_normalization(x, skip, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """Fused residual add + RMSNorm: ``s = x + skip; return (RMSNorm(s) * scale, s)``."""
    s = x + skip
    return _rms_norm(s, scale, axis, epsilon, stash_type, "SkipRMSNormalization"), s


# ----------------------------------------------------------------- RotaryEmbedding


def _rotary_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    x = node.inputs[0]
    if x.shape is not None and len(x.shape) not in (3, 4):
        raise ShapeError(f"node {node.describe()}: RotaryEmbedding input must be rank 3 "
                         f"[batch, seq, hidden] or 4 [batch, heads, seq, head_size], got {list(x.shape)}")
    if x.shape is not None and len(x.shape) == 3 and not node.attrs.get("num_heads"):
        raise ShapeError(f"node {node.describe()}: a 3D RotaryEmbedding input needs the num_heads "
                         f"attribute, none was given")
    return [(x.dtype, x.shape)]


@register("RotaryEmbedding", since=23, shape=_rotary_shape)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                     rotary_embedding_dim=0, num_heads=0):
    """Rotate the first ``rotary_embedding_dim`` features of each head.

    x: [B, H, S, D] or [B, S, H*D] (needs num_heads). cos/sin: [max_pos, R/2] gathered by
    position_ids [B, S], or already [B, S, R/2] when position_ids is omitted.
    """
    rank = x.dim()
    if rank == 4:
        xs = x.transpose(1, 2)                                    # [B, S, H, D]
    elif rank == 3:
        if not num_heads:
            raise ValueError("RotaryEmbedding: a 3D input [batch, seq, hidden] needs num_heads")
        b, s, hidden = x.shape
        if hidden % num_heads:
            raise ValueError(f"RotaryEmbedding: hidden size {hidden} is not divisible by "
                             f"num_heads={num_heads}")
        xs = x.reshape(b, s, num_heads, hidden // num_heads)     # [B, S, H, D]
    else:
        raise ValueError(f"RotaryEmbedding: input must be rank 3 or 4, got shape {list(x.shape)}")
    head = xs.shape[-1]
    rot = rotary_embedding_dim or head
    if rot > head or rot % 2:
        raise ValueError(f"RotaryEmbedding: rotary_embedding_dim={rot} must be even and <= head "
                         f"size {head}")
    if position_ids is not None:
        cos, sin = cos_cache[position_ids.long()], sin_cache[position_ids.long()]  # [B, S, R/2]
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != rot // 2 or sin.shape[-1] != rot // 2:
        raise ValueError(f"RotaryEmbedding: cos/sin caches have last dim {cos.shape[-1]}/"
                         f"{sin.shape[-1]}, expected rotary_embedding_dim/2 = {rot // 2}")
    cos = cos.to(x.dtype).unsqueeze(2)                            # [B, S, 1, R/2]
    sin = sin.to(x.dtype).unsqueeze(2)
    x_rot, x_pass = xs[..., :rot], xs[..., rot:]
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        x1, x2 = x_rot[..., :rot // 2], x_rot[..., rot // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = torch.stack((real, imag), dim=-1).reshape(x_rot.shape)
    else:
        rotated = torch.cat((real, imag), dim=-1)
    out = torch.cat((rotated, x_pass), dim=-1) if rot < head else rotated
    return out.reshape(x.shape) if rank == 3 else out.transpose(1, 2)


register("RotaryEmbedding", domain="shapeplan", since=1, shape=_rotary_shape)(rotary_embedding)


# ----------------------------------------------------------------- gated activations


def _swiglu_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    a, b = node.inputs[0], node.inputs[1]
    if a.shape is not None and b.shape is not None and len(a.shape) != len(b.shape):
        raise ShapeError(f"node {node.describe()}: SwiGLU needs inputs of identical shape, got "
                         f"{list(a.shape)} and {list(b.shape)}")
    return [(a.dtype, a.shape if a.shape is not None else b.shape)]


@register("SwiGLU", since=28, traits=Trait.ELEMENTWISE, shape=_swiglu_shape)
def swiglu(a, b, *, alpha=1.0):
    """Y = A * sigmoid(alpha * A) * B (A and B of identical shape, no broadcasting)."""
    if a.shape != b.shape:
        raise ValueError(f"SwiGLU: inputs A {list(a.shape)} and B {list(b.shape)} must have "
                         f"identical shapes (no broadcasting)")
    return a * torch.sigmoid(alpha * a) * b


def _silu_mul_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    x = node.inputs[0]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return [(x.dtype, x.shape)]
    if x.shape is None:
        return [(x.dtype, None)]
    last = x.shape[-1]
    if isinstance(last, int) and last % 2:
        raise ShapeError(f"node {node.describe()}: SiluMul with one input splits its last dim in "
                         f"halves, but that dim is {last} (odd)")
    return [(x.dtype, tuple(x.shape[:-1]) + (dim_div(last, 2),))]


@register("SiluMul", domain="shapeplan", since=1, shape=_silu_mul_shape)
def silu_mul(gate, up=None):
    """silu(gate) * up; with one input x [..., 2F]: gate = x[..., :F], up = x[..., F:]."""
    if up is None:
        if gate.shape[-1] % 2:
            raise ValueError(f"SiluMul: single input of shape {list(gate.shape)} has an odd last "
                             f"dim; it must split into gate and up halves")
        gate, up = gate.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
