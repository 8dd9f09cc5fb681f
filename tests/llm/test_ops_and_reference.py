"""The LLM ops on their own, and the gpt-fast-style torch baseline against the pipeline."""
from __future__ import annotations

import pytest
import torch

from shapeplan.ops.llm import (cache_write, cache_write_kv, cached_attention, causal_mask, position_ids,
                              sample_token, uniform_noise)
from shapeplan.ops.transformer import rotary_embedding
from tests.llm.conftest import MODEL_TYPES


def test_cache_write_in_place_at_device_position():
    cache = torch.zeros(1, 2, 8, 4)
    upd = torch.randn(1, 2, 3, 4)
    out = cache_write(cache, upd, torch.tensor([4]))
    assert out.data_ptr() == cache.data_ptr()
    torch.testing.assert_close(cache[:, :, 4:7], upd)
    assert cache[:, :, :4].abs().sum() == 0 and cache[:, :, 7:].abs().sum() == 0
    one = torch.randn(1, 2, 1, 4)                     # decode: the position is the index itself
    cache_write(cache, one, torch.tensor([1]))
    torch.testing.assert_close(cache[:, :, 1:2], one)


@pytest.mark.parametrize("s", [1, 3])
def test_cache_write_kv_is_both_writes(s):
    kc, vc = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
    k, v = torch.randn(1, 2, s, 4), torch.randn(1, 2, s, 4, dtype=torch.float64)    # cast to the cache's dtype
    pos = torch.tensor([4])
    ref_k, ref_v = cache_write(kc.clone(), k, pos), cache_write(vc.clone(), v, pos)
    k_all, v_all = cache_write_kv(kc, vc, k, v, pos)
    assert k_all is kc and v_all is vc
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)
    cos, sin = torch.randn(1, s, 2), torch.randn(1, s, 2)   # k rotated first: RotaryEmbedding, then the write
    rotated = rotary_embedding(k, cos, sin, interleaved=1)
    ref_k = cache_write(kc.clone(), rotated, pos)
    cache_write_kv(kc, vc, k, v, pos, cos, sin, interleaved=1)
    assert torch.equal(kc, ref_k)


@pytest.mark.parametrize("mask_dtype", ["bool", "float32"])
@pytest.mark.parametrize("window", [0, 3])
def test_cached_attention_matches_naive(window, mask_dtype):
    torch.manual_seed(0)
    b, hq, hkv, s, L, d, pos = 1, 4, 2, 3, 10, 8, 5
    q = torch.randn(b, hq, s, d)
    k, v = torch.randn(b, hkv, L, d), torch.randn(b, hkv, L, d)
    mask = causal_mask(torch.zeros(b, s, dtype=torch.int64), torch.tensor([pos]), kv_length=L, window=window,
                       groups=hq // hkv, dtype=mask_dtype)
    out = cached_attention(q, k, v, mask, scale=0.3)
    kr, vr = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    scores = q @ kr.transpose(-1, -2) * 0.3
    qp, kp = torch.arange(s)[:, None] + pos, torch.arange(L)[None, :]
    ok = (kp <= qp) & ((kp > qp - window) if window else True)
    ref = torch.softmax(scores.masked_fill(~ok, float("-inf")), -1) @ vr
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_position_ids():
    assert position_ids(torch.zeros(2, 3, dtype=torch.int64), torch.tensor([7])).tolist() == [[7, 8, 9]] * 2


def test_last_token_is_each_rows_last_valid_token():
    from shapeplan.ops.llm import last_token
    h = torch.randn(3, 5, 4)
    got = last_token(h, torch.tensor([5, 2, 0]))                  # full, two tokens, a padding row
    assert got.shape == (3, 1, 4)
    assert torch.equal(got[:, 0], torch.stack([h[0, 4], h[1, 1], h[2, 0]]))
    one = torch.randn(2, 1, 4)
    assert last_token(one, torch.tensor([1, 0])) is one           # a decode step: h itself, no kernel


def test_embedding_is_gather_on_axis_0_and_rejects_what_gather_would_wrap():
    from shapeplan.ops.index import gather
    from shapeplan.ops.llm import embedding
    table, ids = torch.randn(10, 3), torch.tensor([[0, 9, 4], [2, 2, 7]])
    assert torch.equal(embedding(table, ids), gather(table, ids, axis=0))
    for bad in (-1, 10):                                           # a token id is never negative
        with pytest.raises(IndexError):
            embedding(table, torch.tensor([bad]))


def test_noise_is_uniform_and_reproducible():
    u = uniform_noise(torch.tensor([1, 2]), torch.tensor([3]), 20000)
    assert u.shape == (2, 20000) and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01
    assert torch.equal(u, uniform_noise(torch.tensor([1, 2]), torch.tensor([3]), 20000))
    assert not torch.equal(u[0], u[1])


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    draws = [sample_token(logits, params, torch.tensor([11]), torch.tensor([p])).item() for p in range(3000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03, rtol=0)
    # top-k 2 and top-p 0.6 both keep only the two most likely tokens
    for row in ([1.0, 2.0, 1.0, 1.0], [1.0, 0.0, 0.6, 1.0]):
        picks = {sample_token(logits, torch.tensor([row]), torch.tensor([5]), torch.tensor([p])).item()
                 for p in range(300)}
        assert picks == {0, 1}
    # temperature 0 is greedy; the repetition penalty demotes a seen token
    seen = torch.tensor([[True, False, False, False]])
    greedy = torch.tensor([[0.0, 0.0, 1.0, 3.0]])
    assert sample_token(logits, greedy, torch.tensor([0]), torch.tensor([0]), seen).item() == 1
    # the additive terms come after the penalty: here they lift token 3 over token 1
    adjust = torch.tensor([[0.0, -0.5, 0.0, 2.5]])
    assert sample_token(logits, greedy, torch.tensor([0]), torch.tensor([0]), seen, adjust).item() == 3
    draws = {sample_token(logits, params, torch.tensor([11]), torch.tensor([p]), None,
                          torch.tensor([[-100.0, 0.0, 0.0, -100.0]])).item() for p in range(300)}
    assert draws == {1, 2}                                     # a bias of -100 removes a token from the draw


@pytest.mark.parametrize("min_p", [0.0, 0.29, 0.31, 0.7])
def test_min_p_keeps_the_tokens_transformers_keeps_and_draws_from_them(min_p):
    """min-p after top-p: the tokens drawn are those transformers' MinPLogitsWarper keeps (p >= min_p x p_max),
    in proportion to their probabilities; a 4-column params row (no min_p) keeps them all."""
    from transformers.generation.logits_process import MinPLogitsWarper
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = set(torch.nonzero(MinPLogitsWarper(min_p)(None, logits.clone())[0] > float("-inf")).reshape(-1).tolist()) \
        if min_p > 0 else {0, 1, 2, 3}
    params = torch.tensor([[1.0, 0.0, 1.0, 1.0, min_p]])
    draws = [sample_token(logits, params, torch.tensor([13]), torch.tensor([p])).item() for p in range(3000)]
    assert set(draws) == kept
    want = torch.tensor([0.5, 0.3, 0.15, 0.05]) * torch.tensor([float(i in kept) for i in range(4)])
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    torch.testing.assert_close(freq, want / want.sum(), atol=0.03, rtol=0)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_torch_baseline_agrees_with_pipeline(model_type, checkpoints):
    from shapeplan.llm import GenerationPipeline
    from shapeplan.llm.config import LlamaConfig
    from shapeplan.llm.reference import TorchDecoder
    from shapeplan.llm.weights import load_weights
    path = checkpoints(model_type)
    cfg = LlamaConfig.from_file(path)
    ref = TorchDecoder(cfg, load_weights(path, cfg, progress=False), max_kv_cache_length=96)
    pipe = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", max_prefill_length=32,
                                              max_kv_cache_length=96, progress=False, eos_token_ids=[])
    res = pipe.generate("Hello world! Python, torch", max_new_tokens=20)
    assert ref.generate(res.prompt_token_ids, 20) == res.token_ids
