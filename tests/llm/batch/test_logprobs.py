"""Log-probabilities from the serving core: every generated token's logprob and its top-K alternatives
equal ``torch.log_softmax`` of ``pipe.score``'s logits at that position (float32, CPU), greedy and
sampled, in a batch beside requests that want none (whose tokens and plans stay as they were)."""
from __future__ import annotations

import pytest
import torch

from shapeplan.errors import InputError
from shapeplan.llm import GenerationPipeline, Sampling
from shapeplan.llm.model import TOP_LOGPROBS
from tests.llm.conftest import AHEAD, launched_ahead

KW = dict(mode="emulated_replay", max_prefill_length=64, max_kv_cache_length=128, progress=False, sync_every=4,
          max_num_seqs=16)


@pytest.fixture(scope="module")
def pipe(checkpoints):
    p = GenerationPipeline.from_pretrained(checkpoints("llama"), **KW)
    yield p
    p.close()


def _events(handle):
    ids, lps = [], []
    for ev in handle:
        ids += ev.token_ids
        if ev.token_ids:
            assert ev.logprobs is not None and len(ev.logprobs) == len(ev.token_ids)
            lps += ev.logprobs
    assert handle.finish_reason in ("stop", "length")
    return ids, lps


def _check(pipe, prompt: list[int], ids: list[int], lps, top: int) -> None:
    ref = torch.log_softmax(pipe.score(prompt + ids[:-1]).float(), dim=-1)     # [n, V]
    for j, (t, lp) in enumerate(zip(ids, lps)):
        row = ref[len(prompt) - 1 + j]
        assert lp.logprob == pytest.approx(row[t].item(), abs=1e-4)
        vals, idx = torch.topk(row, top)
        assert [i for i, _ in lp.top] == idx.tolist()
        assert [v for _, v in lp.top] == pytest.approx(vals.tolist(), abs=1e-4)


def test_greedy_logprobs_equal_log_softmax_of_the_scored_logits(pipe):
    prompt = pipe.encode("The quick brown fox")
    ids, lps = _events(pipe.submit(prompt, 20, Sampling.greedy(), ignore_eos=True, logprobs=5))
    assert len(ids) == 20
    _check(pipe, prompt, ids, lps, 5)
    assert all(lp.top[0][0] == t and lp.top[0][1] == lp.logprob for t, lp in zip(ids, lps))   # greedy = argmax


def test_sampled_logprobs_are_the_picked_tokens_under_the_raw_distribution(pipe):
    prompt = pipe.encode("Hello world")
    s = Sampling.random(temperature=1.3, top_p=0.95, seed=7)
    ids, lps = _events(pipe.submit(prompt, 16, s, ignore_eos=True, logprobs=TOP_LOGPROBS))
    _check(pipe, prompt, ids, lps, TOP_LOGPROBS)
    assert any(lp.top[0][0] != t for t, lp in zip(ids, lps))        # sampling did not always take the argmax
    plain = pipe.submit(prompt, 16, s, ignore_eos=True)                  # the default plans, the same seed
    plain.wait()
    assert plain.token_ids == ids


def test_logprobs_zero_gives_the_tokens_logprob_only(pipe):
    prompt = pipe.encode("Once upon a time")
    ids, lps = _events(pipe.submit(prompt, 6, ignore_eos=True, logprobs=0))
    assert all(lp.top == () for lp in lps)
    _check(pipe, prompt, ids, lps, 0)


@AHEAD
def test_a_batch_with_and_without_logprobs_keeps_everyones_tokens(pipe, ahead):
    prompts = [pipe.encode(t) for t in ("Explain KV caching", "A compile-once engine", "Hello", "0 1 2 3")]
    alone = [pipe.generate(p, 12, Sampling.greedy()).token_ids for p in prompts]
    with launched_ahead(pipe, ahead):
        handles = [pipe.submit(p, 12, Sampling.greedy(), logprobs=3 if i % 2 else None)
                   for i, p in enumerate(prompts)]
        streams = [list(h) for h in handles]                # submitted together: one packed prefill call
    for i, (h, want, events) in enumerate(zip(handles, alone, streams)):
        assert h.token_ids == want
        assert all((ev.logprobs is not None) == bool(i % 2 and ev.token_ids) for ev in events)
        if i % 2:
            _check(pipe, prompts[i], h.token_ids, [lp for ev in events for lp in ev.logprobs or ()], 3)


def test_default_plans_do_not_compute_logprobs(checkpoints):
    p = GenerationPipeline.from_pretrained(checkpoints("llama"), **KW)
    try:
        p.warmup()
        p.generate("Hello", 8)
        assert p.runner.settled and not any(out.endswith("+logprobs") for out, _, _ in p.runner.settled)
        names = {n for key in p.engine._plans if key for n in key}
        assert not names & {"next_token_logprob", "top_logprobs", "top_token_ids"}
    finally:
        p.close()


@pytest.mark.parametrize("bad", [-1, TOP_LOGPROBS + 1])
def test_logprobs_out_of_range_is_an_input_error(pipe, bad):
    with pytest.raises(InputError, match="logprobs"):
        pipe.submit("Hello", 4, logprobs=bad)


def test_queue_time_is_known_after_admission(pipe):
    h = pipe.submit("Hello", 4)
    h.wait()
    assert h.queue_time is not None and 0 <= h.queue_time < 10


def test_logprobs_beside_a_constrained_request(pipe):
    """A batch with a constrained row runs the masked sampler path; a row there that asked for logprobs
    still gets its tokens (those it gets alone) and their logprobs. A constrained request cannot ask."""
    pytest.importorskip("xgrammar")
    from shapeplan.llm import Constraint
    prompt = pipe.encode("Explain KV caching")
    alone = pipe.generate(prompt, 12).token_ids
    con = pipe.submit("Hello", 12, Sampling(temperature=1.0, seed=3, constraint=Constraint.json_object()))
    h = pipe.submit(prompt, 12, Sampling.greedy(), logprobs=2)
    ids, lps = _events(h)
    con.wait()
    assert ids == alone and con.finish_reason in ("stop", "length")
    _check(pipe, prompt, ids, lps, 2)
    with pytest.raises(InputError, match="constraint"):
        pipe.submit("Hello", 4, Sampling(constraint=Constraint.json_object()), logprobs=1)
