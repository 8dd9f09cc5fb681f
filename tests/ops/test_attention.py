"""Attention ops: ONNX Attention (23/24/25), LinearAttention, FlexAttention, shapeplan::Attention.

Numbers are checked against onnx.reference.ReferenceEvaluator (the ONNX reference) and against
plain torch math; shapes against the symbolic shape functions.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp
from shapeplan.ops.attention import attention as attention_kernel

RNG = np.random.default_rng(0)
_NP2ONNX = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.bool_: TensorProto.BOOL,
            np.int64: TensorProto.INT64, np.float64: TensorProto.DOUBLE}


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def single_node_model(op: str, feeds: dict[str, np.ndarray | None], n_out: int, opset: int = 23,
                      domain: str = "", out_names: list[str] | None = None, **attrs) -> onnx.ModelProto:
    """A model with one ``op`` node; a None feed is a missing optional input."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    while names and names[-1] == "":
        names.pop()
    outs = out_names or [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    ins = [helper.make_tensor_value_info(k, _NP2ONNX[v.dtype.type], v.shape)
           for k, v in feeds.items() if v is not None]
    outs_vi = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs if o]
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    graph = helper.make_graph([node], "g", ins, outs_vi)
    return helper.make_model(graph, opset_imports=imports)


def run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray | None]):
    feeds = {k: v for k, v in feeds.items() if v is not None}
    want = ReferenceEvaluator(model).run(None, feeds)
    engine = sp.compile(model, mode="slot_by_slot", optimize=False)
    res = engine.run(feeds)
    got = [res[o.name] for o in model.graph.output]
    return got, want


def assert_close(got, want, rtol=1e-4, atol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def attn_feeds(b=2, hq=4, hkv=4, sq=3, skv=5, d=8, dv=8, past=0, mask=None, three_d=False,
               nonpad=None, dtype=np.float32):
    if three_d:
        f = {"Q": randn(b, sq, hq * d, dtype=dtype), "K": randn(b, skv, hkv * d, dtype=dtype),
             "V": randn(b, skv, hkv * dv, dtype=dtype)}
    else:
        f = {"Q": randn(b, hq, sq, d, dtype=dtype), "K": randn(b, hkv, skv, d, dtype=dtype),
             "V": randn(b, hkv, skv, dv, dtype=dtype)}
    total = past + skv
    if mask == "bool":
        m = RNG.random((sq, total)) > 0.3
        m[:, 0] = True
        f["attn_mask"] = m
    elif mask == "bool4d":
        f["attn_mask"] = RNG.random((b, hq, sq, total)) > 0.3
    elif mask == "float":
        f["attn_mask"] = randn(sq, total, dtype=dtype)
    elif mask == "float3d":
        f["attn_mask"] = randn(hq, sq, total, dtype=dtype)
    elif mask == "short":                     # shorter than kv: padded with -inf
        f["attn_mask"] = randn(sq, total - 1, dtype=dtype)
    else:
        f["attn_mask"] = None
    f["past_key"] = randn(b, hkv, past, d, dtype=dtype) if past else None
    f["past_value"] = randn(b, hkv, past, dv, dtype=dtype) if past else None
    f["nonpad_kv_seqlen"] = None if nonpad is None else np.asarray(nonpad, dtype=np.int64)
    return f


CASES = {
    "mha": ({}, {}),
    "gqa": ({"hq": 6, "hkv": 2}, {}),
    "mqa_diff_v": ({"hq": 4, "hkv": 1, "dv": 5}, {}),
    "scaled": ({}, {"scale": 0.3}),
    "causal_square": ({"sq": 5}, {"is_causal": 1}),
    "causal_cross": ({"sq": 3, "skv": 6}, {"is_causal": 1}),
    "bool_mask": ({"mask": "bool"}, {}),
    "bool_mask_4d": ({"mask": "bool4d"}, {}),
    "float_mask_3d": ({"mask": "float3d"}, {}),
    "short_mask": ({"mask": "short"}, {}),
    "bool_mask_causal": ({"mask": "bool", "sq": 5}, {"is_causal": 1}),
    "softcap": ({}, {"softcap": 2.0}),
    "softcap_mask": ({"mask": "float"}, {"softcap": 3.0}),
    "3d": ({"three_d": True}, {"q_num_heads": 4, "kv_num_heads": 4}),
    "3d_gqa_causal": ({"three_d": True, "hq": 4, "hkv": 2, "sq": 5}, {"q_num_heads": 4, "kv_num_heads": 2,
                                                                     "is_causal": 1}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_reference(name):
    shape_kw, attrs = CASES[name]
    feeds = attn_feeds(**shape_kw)
    model = single_node_model("Attention", feeds, 1, **attrs)
    assert_close(*run_both(model, feeds))


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("gqa", [False, True])
def test_attention_past_and_present(three_d, causal, gqa):
    hq, hkv = (4, 2) if gqa else (4, 4)
    feeds = attn_feeds(hq=hq, hkv=hkv, sq=2, skv=2, past=4, mask="float", three_d=three_d)
    attrs = {"is_causal": causal}
    if three_d:
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    model = single_node_model("Attention", feeds, 3, **attrs)
    got, want = run_both(model, feeds)
    assert_close(got, want)
    assert got[1].shape == (2, hkv, 6, 8)                            # present = past ++ new


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(mode):
    feeds = attn_feeds(mask="float", past=2)
    model = single_node_model("Attention", feeds, 4, qk_matmul_output_mode=mode, softcap=4.0)
    got, want = run_both(model, feeds)
    assert_close(got[:3], want[:3])
    if mode == 0:      # spec: raw QK (the reference also softcaps here; the spec says before softcap)
        q, k = (torch.from_numpy(feeds[n]) for n in ("Q", "past_key"))
        k = torch.cat((k, torch.from_numpy(feeds["K"])), dim=2)
        raw = (q @ k.transpose(-1, -2) / math.sqrt(8)).numpy()
        np.testing.assert_allclose(got[3], raw, rtol=1e-4, atol=1e-5)
    else:
        assert_close(got[3:], want[3:])


def test_attention_fully_masked_row_is_zero_not_nan():
    feeds = attn_feeds(mask="bool")
    feeds["attn_mask"][1, :] = False
    model = single_node_model("Attention", feeds, 4, qk_matmul_output_mode=3)
    got, want = run_both(model, feeds)
    assert_close([got[0], got[3]], [want[0], want[3]])
    assert not np.isnan(got[0]).any()
    assert (got[0][:, :, 1] == 0).all() and (got[3][:, :, 1] == 0).all()


def test_attention_fully_masked_row_on_the_sdpa_path():
    feeds = attn_feeds(mask="bool4d")
    feeds["attn_mask"][0, 2, 1, :] = False
    model = single_node_model("Attention", feeds, 1)            # Y only: the SDPA fast path
    got, want = run_both(model, feeds)
    assert_close(got, want)
    assert (got[0][0, 2, 1] == 0).all() and not np.isnan(got[0]).any()


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen_opset24(causal):
    feeds = attn_feeds(hq=4, hkv=2, sq=2, skv=6, nonpad=[4, 6])
    model = single_node_model("Attention", feeds, 1, opset=24, is_causal=causal)
    assert_close(*run_both(model, feeds))


@pytest.mark.parametrize("left,right,causal", [(2, -1, 1), (1, 1, 0), (-1, 0, 0)])
def test_attention_sliding_window_opset25(left, right, causal):
    feeds = attn_feeds(sq=6, skv=6)
    model = single_node_model("Attention", feeds, 1, opset=25, is_causal=causal,
                              left_window_size=left, right_window_size=right)
    assert_close(*run_both(model, feeds))


def test_attention_fp16_within_half_precision():
    feeds = attn_feeds(hq=4, hkv=2, mask="float", dtype=np.float16)
    model = single_node_model("Attention", feeds, 1, is_causal=1)
    got, want = run_both(model, feeds)
    assert got[0].dtype == np.float16
    assert_close(got, want, rtol=2e-3, atol=2e-3)


def _torch_attention(q, k, v, bias, scale):
    """Plain-math reference: softmax((q k^T) * scale + bias) v, GQA by interleaved repeat."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias
    return torch.softmax(s, -1) @ v


def test_sdpa_fast_path_and_math_path_agree_with_torch_math():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 5, 16), torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16)
    past_k, past_v = torch.randn(2, 3, 2, 16), torch.randn(2, 3, 2, 16)
    # causal with a past: bottom-right frontier, query i sees keys j <= i + 2
    kk, vv = torch.cat((past_k, k), 2), torch.cat((past_v, v), 2)
    i, j = torch.arange(5)[:, None], torch.arange(9)[None]
    bias = torch.where(j <= i + 2, 0.0, float("-inf"))
    want = _torch_attention(q, kk, vv, bias, 0.25)
    fast = attention_kernel(q, k, v, None, past_k, past_v, is_causal=1, _n_out=3)
    math_path = attention_kernel(q, k, v, None, past_k, past_v, is_causal=1, _n_out=4)
    torch.testing.assert_close(fast[0], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(math_path[0], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast[1], kk)
    # plain causal (no past): SDPA's own is_causal flag
    plain = attention_kernel(q, kk, vv, is_causal=1)
    causal = torch.where(j[:, :9] <= i, 0.0, float("-inf"))
    torch.testing.assert_close(plain, _torch_attention(q, kk, vv, causal, 0.25), rtol=1e-5, atol=1e-5)


def test_attention_3d_without_heads_is_a_clear_error():
    feeds = attn_feeds(three_d=True)
    with pytest.raises(sp.ShapeplanError, match="q_num_heads"):
        model = single_node_model("Attention", feeds, 1)
        sp.compile(model, mode="slot_by_slot", optimize=False).run(
            {k: v for k, v in feeds.items() if v is not None})


# ----------------------------------------------------------------- symbolic shapes (shapeplan domain)


def test_shapeplan_attention_symbolic_shapes_3d_gqa_with_past():
    g = sp.Graph()
    q = g.placeholder("q", "float32", ("batch", "seq", 8 * 16))
    k = g.placeholder("k", "float32", ("batch", "seq", 2 * 16))
    v = g.placeholder("v", "float32", ("batch", "seq", 2 * 16))
    pk = g.placeholder("pk", "float32", ("batch", 2, "past", 16))
    pv = g.placeholder("pv", "float32", ("batch", 2, "past", 16))
    y, prk, prv = g.op.Attention(q, k, v, None, pk, pv, q_num_heads=8, kv_num_heads=2, is_causal=1,
                                 _domain="shapeplan", _outputs=3)
    assert y.shape == ("batch", "seq", 128)
    assert prk.shape == ("batch", 2, "past+seq", 16) and prv.shape == prk.shape
    g.set_outputs(y, prk, prv)
    feeds = {"q": randn(1, 3, 128), "k": randn(1, 3, 32), "v": randn(1, 3, 32),
             "pk": randn(1, 2, 4, 16), "pv": randn(1, 2, 4, 16)}
    out = sp.compile(g, mode="slot_by_slot", optimize=False).run(feeds)
    onnx_model = single_node_model(
        "Attention", {"Q": feeds["q"], "K": feeds["k"], "V": feeds["v"], "attn_mask": None,
                      "past_key": feeds["pk"], "past_value": feeds["pv"]}, 3,
        q_num_heads=8, kv_num_heads=2, is_causal=1)
    want = ReferenceEvaluator(onnx_model).run(None, {"Q": feeds["q"], "K": feeds["k"], "V": feeds["v"],
                                                     "past_key": feeds["pk"], "past_value": feeds["pv"]})
    assert_close([out[y.name], out[prk.name]], [want[0], want[1]])


def test_attention_4d_symbolic_shapes_with_qk_output():
    g = sp.Graph(opset=23)
    q = g.placeholder("q", "float16", ("b", 8, "s", 64))
    k = g.placeholder("k", "float16", ("b", 2, "t", 64))
    v = g.placeholder("v", "float16", ("b", 2, "t", 32))
    y, pk, pv, qk = g.op.Attention(q, k, v, _outputs=4)
    assert y.shape == ("b", 8, "s", 32) and str(y.dtype) == str(sp.dtype("float16"))
    assert pk.shape == ("b", 2, "t", 64) and pv.shape == ("b", 2, "t", 32)
    assert qk.shape == ("b", 8, "s", "t")


# ----------------------------------------------------------------- LinearAttention


def _linear_feeds(rule, b=2, t=5, hq=4, hkv=2, dk=4, dv=3, past=False, per_head_decay=True):
    f = {"query": randn(b, t, hq * dk), "key": randn(b, t, hkv * dk) * 0.5, "value": randn(b, t, hkv * dv)}
    f["past_state"] = randn(b, hkv, dk, dv) if past else None
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    f["decay"] = (-np.abs(randn(b, t, hkv if per_head_decay else hkv * dk))) if gated else None
    f["beta"] = (1 / (1 + np.exp(-randn(b, t, hkv)))).astype(np.float32) if delta else None
    return f


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("past", [False, True])
def test_linear_attention_matches_reference(rule, past):
    feeds = _linear_feeds(rule, past=past, per_head_decay=rule != "gated")
    model = single_node_model("LinearAttention", feeds, 2, opset=27, update_rule=rule,
                              q_num_heads=4, kv_num_heads=2)
    assert_close(*run_both(model, feeds))


def test_linear_attention_prefill_equals_step_by_step_decode():
    from shapeplan.ops.attention import linear_attention
    f = {k: (None if v is None else torch.from_numpy(v)) for k, v in _linear_feeds("gated_delta").items()}
    full, state = linear_attention(f["query"], f["key"], f["value"], None, f["decay"], f["beta"],
                                   q_num_heads=4, kv_num_heads=2)
    s, outs = None, []
    for t in range(5):
        o, s = linear_attention(*(f[n][:, t:t + 1] for n in ("query", "key", "value")), s,
                                f["decay"][:, t:t + 1], f["beta"][:, t:t + 1], q_num_heads=4, kv_num_heads=2)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, state, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- FlexAttention (ai.onnx.preview)


def _flex_model(feeds, **attrs):
    return single_node_model("FlexAttention", feeds, 1, opset=26, domain="ai.onnx.preview", **attrs)


def _mod_graph(name, op_scale):
    """A score/prob mod: out = in * op_scale (initializer inside the subgraph)."""
    init = helper.make_tensor("c", TensorProto.FLOAT, [], [op_scale])
    node = helper.make_node("Mul", ["x", "c"], ["y"])
    return helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [init])


@pytest.mark.parametrize("attrs", [{}, {"scale": 0.2}, {"score_mod": "score"}, {"prob_mod": "prob"}])
def test_flex_attention_matches_reference(attrs):
    feeds = {"Q": randn(1, 4, 3, 8), "K": randn(1, 2, 5, 8), "V": randn(1, 2, 5, 6)}
    attrs = dict(attrs)
    if "score_mod" in attrs:
        attrs["score_mod"] = _mod_graph("score_mod", 0.5)
    if "prob_mod" in attrs:
        attrs["prob_mod"] = _mod_graph("prob_mod", 2.0)
    assert_close(*run_both(_flex_model(feeds, **attrs), feeds))


def test_attention_window_attributes_need_opset_25():
    feeds = attn_feeds(sq=4, skv=4)
    model = single_node_model("Attention", feeds, 1, opset=23, left_window_size=2)
    with pytest.raises(sp.ModelError, match="left_window_size"):
        sp.compile(model, mode="slot_by_slot", optimize=False).run(
            {k: v for k, v in feeds.items() if v is not None})
