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


class _OpenAIPenalties:
    """OpenAI's documented presence / frequency penalties as a transformers logits processor: token j's logit
    minus ``frequency`` x (times j was generated) minus ``presence`` x (j was generated at all), counting the
    tokens after the prompt."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        counts = torch.bincount(input_ids[0, self.prompt_len:], minlength=scores.shape[-1]).to(scores.dtype)
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


@pytest.mark.parametrize("mode", MODES)
def test_presence_frequency_penalties_and_logit_bias_greedy_match_transformers(mode, checkpoints, hf_models):
    """Greedy tokens under OpenAI's presence / frequency penalties and a logit bias against transformers with
    the same model: the penalties as OpenAI documents them (a logits processor here), the bias through
    transformers' own ``sequence_bias`` (one-token sequences: a bias on that token at every step)."""
    from transformers import LogitsProcessorList
    path = checkpoints("llama")
    hf = hf_models(path)
    pipe = _pipe(path, mode)
    plain = pipe.generate(PROMPT, max_new_tokens=24, sampling=sp.llm.Sampling.greedy())
    ids = plain.prompt_token_ids
    drawn = sp.llm.Sampling.random(temperature=0.8, repetition_penalty=1.2, seed=3)   # reads the terms' row
    before = pipe.generate(ids, max_new_tokens=24, sampling=drawn).token_ids
    bias = {plain.token_ids[0]: -100.0, 7: 4.0}               # never the plain first pick; token 7 favoured
    for kw in ({"presence_penalty": 1.5, "frequency_penalty": 0.8}, {"frequency_penalty": -0.6},
               {"presence_penalty": -2.0, "frequency_penalty": 0.4},      # repeats: presence counts once
               {"logit_bias": bias}, {"presence_penalty": 0.9, "logit_bias": bias}):
        res = pipe.generate(ids, max_new_tokens=24, sampling=sp.llm.Sampling(**kw))
        procs = LogitsProcessorList([_OpenAIPenalties(len(ids), kw.get("presence_penalty", 0.0),
                                                      kw.get("frequency_penalty", 0.0))])
        extra = {"sequence_bias": {(t,): b for t, b in kw["logit_bias"].items()}} if "logit_bias" in kw else {}
        want = hf_greedy(hf, ids, 24, logits_processor=procs, **extra)
        assert res.token_ids == want, kw
        assert res.token_ids != plain.token_ids, kw                      # (the terms changed the answer)
    # the slot's row is cleared for the next request without the terms
    assert pipe.generate(ids, max_new_tokens=24, sampling=drawn).token_ids == before
