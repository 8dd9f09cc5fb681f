"""Test graphs built from ops registered here in the private ``sptest`` domain (so the runtime tests do
not depend on which ONNX ops other modules provide at the moment). Each op declares the traits the
runtime cares about."""
from __future__ import annotations

import numpy as np
import torch

import shapeplan as sp
from shapeplan.ops.registry import Trait, register

D = "sptest"
EW = Trait.ELEMENTWISE


@register("Add", domain=D, traits=EW | Trait.COMMUTATIVE)
def _add(a, b):
    return a + b


@register("Mul", domain=D, traits=EW | Trait.COMMUTATIVE)
def _mul(a, b):
    return a * b


@register("Relu", domain=D, traits=EW)
def _relu(x):
    return torch.relu(x)


@register("Tanh", domain=D, traits=EW)
def _tanh(x):
    return torch.tanh(x)


@register("Exp", domain=D, traits=EW)
def _exp(x):
    return torch.exp(x)


@register("MatMul", domain=D)
def _matmul(a, b):
    return torch.matmul(a, b)


@register("Softmax", domain=D)
def _softmax(x, axis=-1):
    return torch.softmax(x, dim=axis)


@register("LayerNorm", domain=D)
def _layernorm(x, w, b, eps=1e-5):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps)


@register("Transpose", domain=D, traits=Trait.VIEW)
def _transpose(x, perm=(1, 0)):
    return x.permute(*perm)


@register("Shape", domain=D, traits=Trait.SHAPE_ONLY_OUTPUT)
def _shape(x):
    return torch.tensor(list(x.shape), dtype=torch.int64)


@register("Reshape", domain=D, traits=Trait.VALUE_DEPENDENT_SHAPE | Trait.VIEW)
def _reshape(x, shape):
    return x.reshape([int(d) for d in shape.tolist()])


@register("NonZero", domain=D, traits=Trait.DYNAMIC_OUTPUT_SIZE)
def _nonzero(x):
    return torch.nonzero(x).T.contiguous()


@register("Cast", domain=D, traits=EW)
def _cast_f(x):
    return x.to(torch.float32)


@register("ReduceSum", domain=D, traits=Trait.REDUCTION)
def _rsum(x):
    return x.sum().reshape(1)


@register("Accumulate", domain=D, traits=Trait.MUTATES_INPUT)
def _accumulate(state, x):
    """state += sum(x) in place; returns the new state (a copy)."""
    state.add_(x.sum())
    return state.clone()


def op(g: sp.Graph):
    class _Ops:
        def __getattr__(self, name):
            f = getattr(g.op, name)
            return lambda *a, **k: f(*a, _domain=D, **k)
    return _Ops()


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def mlp(depth: int = 3, width: int = 8) -> sp.Graph:
    g = sp.Graph("mlp")
    o = op(g)
    x = g.placeholder("x", "float32", ("batch", width))
    h = x
    for i in range(depth):
        h = o.Tanh(o.Add(o.MatMul(h, g.constant(rand(width, width, seed=i), name=f"w{i}")),
                         g.constant(rand(width, seed=100 + i), name=f"b{i}")))
    g.set_outputs(h)
    return g


def transformer_stack(layers: int = 12, d: int = 16, t: int = 8) -> sp.Graph:
    """A stack of attention + MLP blocks (the buffer-reuse acceptance graph)."""
    g = sp.Graph("blocks")
    o = op(g)
    x = g.placeholder("x", "float32", (t, d))
    h = x
    for i in range(layers):
        c = lambda a, n: g.constant(a, name=f"l{i}_{n}")  # noqa: E731
        n1 = o.LayerNorm(h, c(np.ones(d, np.float32), "ln1w"), c(np.zeros(d, np.float32), "ln1b"))
        q = o.MatMul(n1, c(rand(d, d, seed=3 * i), "wq"))
        k = o.MatMul(n1, c(rand(d, d, seed=3 * i + 1), "wk"))
        v = o.MatMul(n1, c(rand(d, d, seed=3 * i + 2), "wv"))
        att = o.Softmax(o.Mul(o.MatMul(q, o.Transpose(k)), c(np.float32(d ** -0.5), "scale")))
        h = o.Add(h, o.MatMul(o.MatMul(att, v), c(rand(d, d, seed=99 + i), "wo")))
        n2 = o.LayerNorm(h, c(np.ones(d, np.float32), "ln2w"), c(np.zeros(d, np.float32), "ln2b"))
        m = o.Relu(o.MatMul(n2, c(rand(d, 4 * d, seed=7 + i), "w1")))
        h = o.Add(h, o.MatMul(m, c(rand(4 * d, d, seed=11 + i), "w2")))
    g.set_outputs(h)
    return g


def with_gap() -> sp.Graph:
    """segment -> NonZero (gap, dynamic size) -> segment; plus a Shape->Reshape constant chain."""
    g = sp.Graph("gap")
    o = op(g)
    x = g.placeholder("x", "float32", ("n", 4))
    a = o.Relu(o.Add(x, g.constant(rand(4, seed=1), name="bias")))
    flat = o.Reshape(a, o.Shape(a))           # Shape is plan-constant (x's shape is frozen)
    nz = o.NonZero(flat)
    y = o.Exp(o.Mul(o.Cast(nz), g.constant(np.float32(0.5), name="half")))
    z = o.Tanh(o.Add(flat, a))
    g.set_outputs(y, z)
    return g


def with_state() -> sp.Graph:
    """A variable (persistent state) updated in place every call."""
    g = sp.Graph("state")
    o = op(g)
    x = g.placeholder("x", "float32", ("n",))
    s = g.variable("acc", np.zeros(1, np.float32))
    new = o.Accumulate(s, o.Relu(x))
    y = o.Add(o.Tanh(x), new)
    g.set_outputs(y)
    return g


def ref_engine(g: sp.Graph) -> sp.Engine:
    return sp.Engine(g, mode="slot_by_slot")
