"""Transformer building blocks: LayerNormalization, RMSNormalization, RotaryEmbedding, SwiGLU, and
the shapeplan-domain fused ops (RMSNormalization, RotaryEmbedding, SkipRMSNormalization, SiluMul).

Numbers are checked against onnx.reference.ReferenceEvaluator, torch.nn.functional and a plain
numpy rotary; shapes against the symbolic shape functions.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp
from shapeplan.ops.registry import lookup

RNG = np.random.default_rng(1)
_NP2ONNX = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64}


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def check_vs_reference(op, feeds, n_out=1, opset=23, rtol=1e-5, atol=1e-5, **attrs):
    names = [k if v is not None else "" for k, v in feeds.items()]
    while names and not names[-1]:
        names.pop()
    outs = [f"y{i}" for i in range(n_out)]
    ins = [helper.make_tensor_value_info(k, _NP2ONNX[v.dtype.type], v.shape) for k, v in feeds.items()
           if v is not None]
    graph = helper.make_graph([helper.make_node(op, names, outs, **attrs)], "g", ins,
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {k: v for k, v in feeds.items() if v is not None}
    want = ReferenceEvaluator(model).run(None, feeds)
    res = sp.compile(model, mode="slot_by_slot", optimize=False).run(feeds)
    for o, w in zip(outs, want):
        assert res[o].shape == w.shape, (o, res[o].shape, w.shape)
        np.testing.assert_allclose(res[o].astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return res


# ----------------------------------------------------------------- normalizations


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((2, 3, 4, 5), 1), ((4, 6), 0), ((2, 3, 4), -2)])
def test_layer_normalization_matches_reference(shape, axis):
    ax = axis % len(shape)
    feeds = {"X": randn(*shape), "W": randn(*shape[ax:]), "B": randn(*shape[ax:])}
    res = check_vs_reference("LayerNormalization", feeds, n_out=3, opset=17, axis=axis, epsilon=1e-3)
    assert res["y1"].shape == shape[:ax] + (1,) * (len(shape) - ax)


def test_layer_normalization_matches_torch_without_bias():
    x, w = torch.randn(3, 7, 16), torch.randn(16)
    from shapeplan.ops.transformer import layer_normalization
    y = layer_normalization(x, w)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (16,), w, None, 1e-5))


@pytest.mark.parametrize("shape,axis,eps", [((2, 3, 8), -1, 1e-5), ((2, 3, 4, 5), 2, 0.1), ((4, 6), 0, 1e-5)])
def test_rms_normalization_matches_reference(shape, axis, eps):
    ax = axis % len(shape)
    check_vs_reference("RMSNormalization", {"X": randn(*shape), "W": randn(*shape[ax:])},
                       axis=axis, epsilon=eps)


def test_rms_normalization_fp16_stashes_in_float32():
    from shapeplan.ops.transformer import rms_normalization
    x = (torch.randn(4, 64) * 300).half()           # x^2 overflows float16; float32 stash does not
    w = torch.ones(64, dtype=torch.float16)
    y = rms_normalization(x, w)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    ref = x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(y.float(), ref, rtol=2e-3, atol=2e-3)


def test_shapeplan_skip_rms_normalization():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", "seq", 32))
    r = g.placeholder("r", "float32", ("batch", "seq", 32))
    w = g.constant(np.linspace(0.5, 1.5, 32, dtype=np.float32), name="w")
    normed, total = g.op.SkipRMSNormalization(x, r, w, epsilon=1e-6, _domain="shapeplan", _outputs=2)
    assert normed.shape == total.shape == ("batch", "seq", 32)
    g.set_outputs(normed, total)
    xs, rs = randn(2, 3, 32), randn(2, 3, 32)
    out = sp.compile(g, mode="slot_by_slot", optimize=False).run({"x": xs, "r": rs})
    s = xs + rs
    want = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6) * np.linspace(0.5, 1.5, 32, dtype=np.float32)
    np.testing.assert_allclose(out[total.name], s, rtol=1e-6)
    np.testing.assert_allclose(out[normed.name], want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- rotary


def _caches(max_pos, half):
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    ang = np.arange(max_pos)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
@pytest.mark.parametrize("layout", ["4d", "3d"])
def test_rotary_embedding_matches_reference(interleaved, rot_dim, layout):
    b, h, s, d = 2, 3, 5, 8
    cos, sin = _caches(16, (rot_dim or d) // 2)
    x = randn(b, h, s, d) if layout == "4d" else randn(b, s, h * d)
    pos = RNG.integers(0, 16, size=(b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    if layout == "3d":
        attrs["num_heads"] = h
    check_vs_reference("RotaryEmbedding", {"input": x, "cos_cache": cos, "sin_cache": sin,
                                           "position_ids": pos}, **attrs)


def test_rotary_embedding_without_position_ids():
    cos, sin = _caches(5, 4)
    cos_b, sin_b = np.stack([cos, cos[::-1]]), np.stack([sin, sin[::-1]])     # [B, S, R/2]
    check_vs_reference("RotaryEmbedding", {"input": randn(2, 2, 5, 8), "cos_cache": cos_b, "sin_cache": sin_b})


def test_rotary_half_split_equals_hf_rotate_half():
    """Non-interleaved rotary == the Hugging Face llama formula x*cos + rotate_half(x)*sin."""
    from shapeplan.ops.transformer import rotary_embedding
    b, h, s, d = 1, 2, 6, 8
    cos, sin = (torch.from_numpy(c) for c in _caches(6, d // 2))
    x = torch.randn(b, h, s, d)
    pos = torch.arange(s)[None]
    got = rotary_embedding(x, cos, sin, pos)
    c, sn = torch.cat((cos, cos), -1)[None, None], torch.cat((sin, sin), -1)[None, None]
    rotate_half = torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    torch.testing.assert_close(got, x * c + rotate_half * sn)


def test_shapeplan_rotary_symbolic_shape_and_3d_needs_heads():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", "seq", 64))
    cos = g.placeholder("cos", "float32", (128, 8))
    sin = g.placeholder("sin", "float32", (128, 8))
    pos = g.placeholder("pos", "int64", ("batch", "seq"))
    y = g.op.RotaryEmbedding(x, cos, sin, pos, num_heads=4, _domain="shapeplan")
    assert y.shape == ("batch", "seq", 64)
    with pytest.raises(sp.ShapeError, match="num_heads"):
        g.op.RotaryEmbedding(x, cos, sin, pos, _domain="shapeplan")


# ----------------------------------------------------------------- gated activations


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu_matches_reference(alpha):
    check_vs_reference("SwiGLU", {"a": randn(3, 10), "b": randn(3, 10)}, opset=28, alpha=alpha)


def test_shapeplan_silu_mul_two_inputs_and_split():
    g = sp.Graph()
    gate = g.placeholder("gate", "float32", ("tokens", 16))
    up = g.placeholder("up", "float32", ("tokens", 16))
    fused = g.placeholder("fused", "float32", ("tokens", 32))
    a = g.op.SiluMul(gate, up, _domain="shapeplan")
    b = g.op.SiluMul(fused, _domain="shapeplan")
    assert a.shape == ("tokens", 16) and b.shape == ("tokens", 16)
    g.set_outputs(a, b)
    gs, us = randn(4, 16), randn(4, 16)
    out = sp.compile(g, mode="slot_by_slot", optimize=False).run(
        {"gate": gs, "up": us, "fused": np.concatenate([gs, us], -1)})
    want = torch.nn.functional.silu(torch.from_numpy(gs)).numpy() * us
    np.testing.assert_allclose(out[a.name], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[b.name], want, rtol=1e-6, atol=1e-6)


def test_silu_mul_symbolic_split_dim():
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("tokens", "ffn2"))
    assert g.op.SiluMul(x, _domain="shapeplan").shape == ("tokens", "ffn2/2")


def test_every_op_has_a_shape_function():
    for name, domain, opset in [("Attention", "", 23), ("Attention", "shapeplan", 1),
                                ("RotaryEmbedding", "", 23), ("RotaryEmbedding", "shapeplan", 1),
                                ("RMSNormalization", "", 23), ("RMSNormalization", "shapeplan", 1),
                                ("LayerNormalization", "", 17), ("SwiGLU", "", 28),
                                ("SkipRMSNormalization", "shapeplan", 1), ("SiluMul", "shapeplan", 1),
                                ("LinearAttention", "", 27), ("FlexAttention", "ai.onnx.preview", 1)]:
        opdef = lookup(name, domain, opset)
        assert opdef.shape is not None, name
        assert opdef.capturable, name
