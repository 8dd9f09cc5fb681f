"""Random ops: Dropout (inference and training mode), Bernoulli, RandomNormal/Uniform(+Like), Multinomial.

Seeding: with a ``seed`` attribute the numbers come from ``numpy.random.RandomState(seed)``, drawn
afresh on every call exactly as the ONNX reference evaluator draws them. The same seed therefore
gives the same tensor on every call, on every device, and in every execution mode, and the results
match ``onnx.reference``. The numbers are drawn on the host and copied to the input's device. Without
a seed, torch's RNG draws on the input's device and the results differ from call to call.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops.registry import Trait, register

RANDOM = Trait.RANDOM


def _state(seed: Any) -> np.random.RandomState | None:
    return None if seed is None else np.random.RandomState(int(seed))


def _uniform(shape: tuple, seed: Any, device: Any) -> torch.Tensor:
    """float64 U[0, 1) of ``shape``: numpy RandomState(seed).rand if seeded, else torch on device."""
    st = _state(seed)
    if st is None:
        return torch.rand(shape, dtype=torch.float64, device=device)
    return torch.from_numpy(st.rand(*shape) if shape else np.asarray(st.rand())).to(device)


def _normal(shape: tuple, seed: Any, device: Any) -> torch.Tensor:
    st = _state(seed)
    if st is None:
        return torch.randn(shape, dtype=torch.float64, device=device)
    return torch.from_numpy(st.randn(*shape) if shape else np.asarray(st.randn())).to(device)


# ----------------------------------------------------------------------------- Dropout
def _dropout_shape(node: Any) -> list:
    x = node.inputs[0]
    return [(x.dtype, x.shape), (as_dtype("bool"), x.shape)][: len(node.outputs)]


def _dropout(x: torch.Tensor, ratio: float, training: bool, seed: Any, n_out: int) -> Any:
    if not training or ratio == 0:
        if n_out == 1:
            return x
        return x, torch.ones(x.shape, dtype=torch.bool, device=x.device)
    if seed is None:
        keep = torch.rand(x.shape, device=x.device) >= ratio
    else:   # RandomState(seed).uniform(0, 1, shape) draws the same numbers as .rand(*shape)
        keep = _uniform(tuple(x.shape), seed, x.device) >= ratio
    y = x * keep.to(x.dtype) * (1.0 / (1.0 - ratio))
    return (y, keep) if n_out == 2 else y


@register("Dropout", since=1, traits=RANDOM, shape=_dropout_shape)
def dropout_v1(x, *, ratio=0.5, is_test=0, consumed_inputs=None, _n_out):
    """ONNX Dropout-1..10: an identity at inference (mask all true)."""
    return _dropout(x, ratio, False, None, _n_out)


@register("Dropout", since=12, traits=RANDOM, shape=_dropout_shape, host_inputs=(1, 2))
def dropout(x, ratio=None, training_mode=None, *, seed=None, _n_out):
    """ONNX Dropout: training_mode drops with probability ``ratio`` and scales by 1 / (1 - ratio)."""
    r = float(ratio.reshape(-1)[0]) if ratio is not None else 0.5
    training = bool(training_mode.reshape(-1)[0]) if training_mode is not None else False
    return _dropout(x, r, training, seed, _n_out)


# ----------------------------------------------------------------------------- Bernoulli
def _like_dtype(node: Any, key: str = "dtype") -> Any:
    dt = node.attrs.get(key)
    return as_dtype(dt) if dt is not None else node.inputs[0].dtype


@register("Bernoulli", since=15, traits=RANDOM, shape=lambda n: [(_like_dtype(n), n.inputs[0].shape)])
def bernoulli(x, *, dtype=None, seed=None):
    """ONNX Bernoulli: 1 with probability x."""
    out = as_dtype(dtype).torch if dtype is not None else x.dtype
    st = _state(seed)
    if st is None:
        return torch.bernoulli(x.to(torch.float64)).to(out)
    draws = st.binomial(1, p=x.detach().cpu().to(torch.float64).numpy())
    return torch.from_numpy(np.asarray(draws)).to(device=x.device, dtype=out)


# ----------------------------------------------------------------------------- RandomNormal / RandomUniform
def _attr_shape(node: Any) -> list:
    return [(as_dtype(node.attrs.get("dtype", 1)), tuple(node.attrs["shape"]))]


@register("RandomNormal", since=1, traits=RANDOM | Trait.CREATES_VALUE, shape=_attr_shape)
def random_normal(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None):
    """ONNX RandomNormal (created on the CPU: the op has no input to take a device from)."""
    return (_normal(tuple(shape), seed, None) * scale + mean).to(as_dtype(dtype).torch)


@register("RandomUniform", since=1, traits=RANDOM | Trait.CREATES_VALUE, shape=_attr_shape)
def random_uniform(*, shape, dtype=1, high=1.0, low=0.0, seed=None):
    """ONNX RandomUniform (created on the CPU: the op has no input to take a device from)."""
    return (_uniform(tuple(shape), seed, None) * (high - low) + low).to(as_dtype(dtype).torch)


@register("RandomNormalLike", since=1, traits=RANDOM, shape=lambda n: [(_like_dtype(n), n.inputs[0].shape)])
def random_normal_like(x, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    """ONNX RandomNormalLike."""
    out = as_dtype(dtype).torch if dtype is not None else x.dtype
    return (_normal(tuple(x.shape), seed, x.device) * scale + mean).to(out)


@register("RandomUniformLike", since=1, traits=RANDOM, shape=lambda n: [(_like_dtype(n), n.inputs[0].shape)])
def random_uniform_like(x, *, dtype=None, high=1.0, low=0.0, seed=None):
    """ONNX RandomUniformLike."""
    out = as_dtype(dtype).torch if dtype is not None else x.dtype
    return (_uniform(tuple(x.shape), seed, x.device) * (high - low) + low).to(out)


# ----------------------------------------------------------------------------- Multinomial
def _multinomial_shape(node: Any) -> list:
    x = node.inputs[0]
    batch = x.shape[0] if x.shape is not None else None
    return [(as_dtype(node.attrs.get("dtype", 6)), (batch, node.attrs.get("sample_size", 1)))]


@register("Multinomial", since=7, traits=RANDOM, shape=_multinomial_shape)
def multinomial(x, *, dtype=6, sample_size=1, seed=None):
    """ONNX Multinomial: x [B, C] unnormalized log-probabilities -> [B, sample_size] class ids."""
    probs = torch.softmax(x.to(torch.float64), dim=-1)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=x.device)
        gen.manual_seed(int(seed))
    out = torch.multinomial(probs, sample_size, replacement=True, generator=gen)
    return out.to(as_dtype(dtype).torch)
