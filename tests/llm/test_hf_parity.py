"""Greedy tokens and prefill logits against transformers, float32 on CPU, for every supported family,
in slot_by_slot and emulated_replay, fresh and after a session continuation."""
from __future__ import annotations

import pytest
import torch

import shapeplan as sp
from tests.llm.conftest import MODEL_TYPES, hf_greedy

MODES = ["slot_by_slot", "emulated_replay"]
PROMPT = "Explain KV caching: keys and values"
FOLLOW_UP = " Once upon a time there was a small model."


def _pipe(path: str, mode: str, **kw) -> sp.llm.GenerationPipeline:
    kw = {"max_prefill_length": 64, "max_kv_cache_length": 160, "progress": False, **kw}
    return sp.llm.GenerationPipeline.from_pretrained(path, mode=mode, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_tokens_and_continuation_match_transformers(model_type, mode, checkpoints, hf_models):
    path = checkpoints(model_type)
    hf = hf_models(path)
    pipe = _pipe(path, mode)
    with pipe.start_session() as s:
        first = s.generate(PROMPT, max_new_tokens=32, sampling=sp.llm.Sampling.greedy())
        assert first.token_ids == hf_greedy(hf, first.prompt_token_ids, 32)
        context = first.prompt_token_ids + first.token_ids
        second = s.generate(FOLLOW_UP, max_new_tokens=24)
        follow_ids = pipe.tokenizer.encode(FOLLOW_UP, add_special_tokens=False)
        assert second.prompt_token_ids[-len(follow_ids):] == follow_ids
        assert second.token_ids == hf_greedy(hf, context + follow_ids, 24)
    if mode == "emulated_replay":       # the decode plan (last call) replays as captured segments
        import shapeplan.testing as spt
        spt.assert_fully_replaying(pipe.engine)
        spt.assert_no_address_drift(pipe.engine)
    # the engine state is reusable by a fresh request after the session closed
    again = pipe.generate(PROMPT, max_new_tokens=8)
    assert again.token_ids == first.token_ids[:8]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_prefill_logits_match_transformers(model_type, checkpoints, hf_models):
    path = checkpoints(model_type)
    hf = hf_models(path)
    pipe = _pipe(path, "slot_by_slot")
    ids = pipe.encode(PROMPT)
    got = pipe.score(ids)                                                 # every position's logits
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]                          # [n, V]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_repetition_penalty_greedy_matches_transformers(checkpoints, hf_models):
    path = checkpoints("llama")
    hf = hf_models(path)
    pipe = _pipe(path, "slot_by_slot")
    res = pipe.generate(PROMPT, max_new_tokens=24, sampling=sp.llm.Sampling(repetition_penalty=1.5))
    assert res.token_ids == hf_greedy(hf, res.prompt_token_ids, 24, repetition_penalty=1.5)
