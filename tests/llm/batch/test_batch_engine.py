"""The serving core against single-stream generation, float32 on CPU, for every supported family:
requests of different lengths arriving at different steps, greedy and seeded sampling, get exactly the
tokens each gets alone through ``pipe.generate``; also when the KV pool is so small that requests are
preempted and recomputed, with prefix-cache hits, and after aborts (every block comes back)."""
from __future__ import annotations

import random

import pytest

import shapeplan as sp
from shapeplan.llm import GenerationPipeline, Sampling
from tests.llm.conftest import AHEAD, MODEL_TYPES, launched_ahead

KW = dict(mode="emulated_replay", max_prefill_length=32, max_kv_cache_length=128, progress=False, sync_every=4,
          max_num_seqs=16)


def _requests(vocab: int, n: int = 16, seed: int = 0) -> list[tuple[list[int], int, Sampling]]:
    """``n`` (prompt, max_new_tokens, sampling): prompts of 3-45 tokens (some longer than one 32-token
    prefill chunk), every third request sampled with its own seed, one with a repetition penalty, three with
presence / frequency penalties or a logit bias."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.choice([3, 7, 12, 20, 33, 45]))]
        if i % 3 == 1:
            s = Sampling.random(temperature=0.9, top_k=40, top_p=0.9, seed=100 + i,
                                frequency_penalty=0.9 if i == 10 else 0.0, min_p=0.15 if i == 13 else 0.0)
        elif i == 5:
            s = Sampling(repetition_penalty=1.3)
        elif i == 8:
            s = Sampling(presence_penalty=1.5, frequency_penalty=0.7)
        elif i == 12:
            s = Sampling(frequency_penalty=-0.5, logit_bias={3: 2.0, 4: -100.0})
        else:
            s = Sampling.greedy()
        out.append((prompt, rng.randrange(6, 24), s))
    return out


def _staggered(pipe: GenerationPipeline, reqs) -> list[list[int]]:
    """Submit in three waves, each after the previous wave's first request has produced tokens (so
    requests join a batch that is already decoding); returns each request's tokens."""
    handles, waves = [], [reqs[:6], reqs[6:11], reqs[11:]]
    for wave in waves:
        first = None
        for prompt, n, s in wave:
            h = pipe.submit(prompt, n, s)
            handles.append((h, s))
            first = first or h
        for ev in first:                      # until it has 3 tokens (or ends)
            if len(first.token_ids) >= 3 or ev.finish_reason:
                break
    return [pipe._result(h, s).token_ids for h, s in handles]


@pytest.fixture(scope="module", params=MODEL_TYPES)
def family(request, checkpoints):
    path = checkpoints(request.param)
    pipe = GenerationPipeline.from_pretrained(path, **KW)
    reqs = _requests(pipe.cfg.vocab_size)
    alone = [pipe.generate(p, n, s).token_ids for p, n, s in reqs]
    return path, pipe, reqs, alone


def test_batched_tokens_equal_each_request_alone(family):
    _, pipe, reqs, alone = family
    sched = pipe.scheduler
    left_out = []                                     # running requests a launched-ahead round did not hold

    def reserve_ahead(rows, ahead, orig=sched.reserve_ahead):
        left_out.extend(s.rid for s in sched.running if s not in rows)
        return orig(rows, ahead)

    sched.reserve_ahead = reserve_ahead
    try:
        with launched_ahead(pipe, True):              # forced on (auto: on a GPU only): rounds launched ahead
            assert _staggered(pipe, reqs) == alone
    finally:
        del sched.reserve_ahead
    assert not left_out, f"requests {sorted(set(left_out))} waited outside rounds launched ahead"
    stats = pipe.kv_stats()
    assert stats["blocks_used"] == 0 and stats["running"] == stats["waiting"] == 0


def test_a_lone_stream_launched_ahead_gets_the_tokens_it_gets_without(family):
    """SHAPEPLAN_LAUNCH_AHEAD's default launches rounds ahead on a GPU (on the CPU it is
    off: nothing to overlap); forced on here: every request alone, one ended mid-round by a stop token, and
    a session's second turn get the tokens they get without it, and the dropped rounds leave no block."""
    _, pipe, reqs, alone = family
    with launched_ahead(pipe, "auto"):
        assert not pipe.batch._ahead()                # the CPU: off
    stop = alone[0][len(alone[0]) // 2]
    with launched_ahead(pipe, False):
        want = [pipe.generate(p, n, s).token_ids for p, n, s in reqs]
        ended = pipe.generate(reqs[0][0], 24, Sampling(stop_token_ids=[stop]))
        with pipe.start_session() as sess:
            turns = [sess.generate(p, n, s).token_ids for p, n, s in reqs[1:3]]
    with launched_ahead(pipe, True):
        assert [pipe.generate(p, n, s).token_ids for p, n, s in reqs] == want == alone
        again = pipe.generate(reqs[0][0], 24, Sampling(stop_token_ids=[stop]))
        with pipe.start_session() as sess:
            assert [sess.generate(p, n, s).token_ids for p, n, s in reqs[1:3]] == turns
    assert again.token_ids == ended.token_ids and again.finish_reason == ended.finish_reason == "stop"
    assert pipe.kv_stats()["blocks_used"] == 0


def test_decode_inputs_written_in_place_give_the_tokens_of_copied_ones(family):
    """A decode round writes each step's token and position straight into the plan's input buffers
    (SHAPEPLAN_DECODE_IN_PLACE, on by default); with every step's inputs copied in and outputs copied out
    instead, every request gets the same tokens, alone and batched."""
    _, pipe, reqs, alone = family
    runner, engine = pipe.batch.runner, pipe.batch.runner.engine
    staged, was = [], runner.in_place
    engine.input_buffers = lambda feeds, outputs, orig=engine.input_buffers: staged.append(orig(feeds, outputs)) \
        or staged[-1]
    try:
        runner.in_place = True
        assert [pipe.generate(p, n, s).token_ids for p, n, s in reqs[:3]] == alone[:3]
        assert staged and all(sorted(d) == ["block_tables", "input_ids", "lengths", "positions", "state_slots"]
                              for d in staged)
        runner.in_place = False
        assert [pipe.generate(p, n, s).token_ids for p, n, s in reqs] == alone
        assert _staggered(pipe, reqs) == alone
    finally:
        runner.in_place = was
        del engine.input_buffers


def test_generate_batch_returns_results_in_order(family):
    _, pipe, reqs, alone = family
    res = pipe.generate_batch([p for p, _, _ in reqs], max_new_tokens=8, sampling=[s for _, _, s in reqs])
    for r, a, (_, n, _) in zip(res, alone, reqs):
        m = min(len(r.token_ids), len(a))
        assert r.token_ids[:m] == a[:m]
        assert len(r.token_ids) == 8 or r.finish_reason == "stop"
    assert all(r.finish_reason in ("stop", "length") and r.metrics.new_tokens == len(r.token_ids) for r in res)


@AHEAD
def test_a_pool_too_small_for_everyone_preempts_and_loses_nothing(family, ahead):
    """12 blocks of 16 tokens for 16 requests that start in one block each and grow to three: requests
    are admitted, outgrow the pool, are preempted (their blocks freed) and recomputed later, and still
    produce exactly the tokens each produces alone (also with the rounds launched ahead, a GPU's default)."""
    path, pipe, reqs, _ = family
    grow = [(p[:10], 36, s) for p, _, s in reqs]
    alone = [pipe.generate(p, n, s).token_ids for p, n, s in grow]
    per_block = pipe.kv_cache_bytes // pipe.paged.num_blocks
    small = GenerationPipeline.from_pretrained(path, **{**KW, "kv_cache_bytes": 12 * per_block})
    assert small.paged.num_blocks == 13
    with launched_ahead(small, ahead):
        assert _staggered(small, grow) == alone
    stats = small.kv_stats()
    assert stats["preemptions"] > 0, stats
    assert stats["blocks_used"] == 0


@AHEAD
def test_prefix_cache_hits_give_the_tokens_of_misses(family, ahead):
    path, pipe, _, _ = family
    system = list(range(40, 88))                                   # 48 tokens: three full blocks
    prompts = [system + [5 + i, 9, 11 + i] for i in range(6)] + [system]   # the last: an exact full hit
    cold = GenerationPipeline.from_pretrained(path, **{**KW, "prefix_cache": False})
    want = [cold.generate(p, 10).token_ids for p in prompts]
    pipe.clear_prefix_cache()
    pipe.generate(system + [1], 4)                                  # caches the system prompt's blocks
    before = pipe.prefix_cache_stats()
    with launched_ahead(pipe, ahead):
        got = [r.token_ids for r in pipe.generate_batch(prompts, max_new_tokens=10)]
    after = pipe.prefix_cache_stats()
    assert got == want
    assert after["total_hits"] - before["total_hits"] >= len(prompts)
    assert after["total_hit_tokens"] - before["total_hit_tokens"] >= 48 * len(prompts)
    assert set(after) >= {"block_size", "max_byte_budget", "resident_blocks", "current_bytes", "total_lookups",
                          "total_hits", "hit_rate", "total_hit_tokens", "total_stored_tokens"}


@AHEAD
def test_abort_frees_every_block_at_once(family, ahead):
    _, pipe, reqs, _ = family
    start = pipe.kv_stats()["blocks_free"]
    with launched_ahead(pipe, ahead):
        handles = [pipe.submit(p, 100, Sampling.greedy(), ignore_eos=True) for p, _, _ in reqs[:5]]
        for ev in handles[0]:
            if len(handles[0].token_ids) >= 5:
                break
        handles[0].abort()
        handles[3].abort()
        for h in handles:
            h.wait()
    assert handles[0].finish_reason == handles[3].finish_reason == "abort"
    assert len(handles[0].token_ids) < 100
    assert all(h.finish_reason == "length" for i, h in enumerate(handles) if i not in (0, 3))
    assert pipe.kv_stats()["blocks_free"] == start
    with pytest.raises(sp.RequestAborted):
        handles[0].raise_for_error()


def test_bad_requests_fail_alone_and_the_engine_keeps_serving(family):
    _, pipe, reqs, alone = family
    with pytest.raises(sp.InputError, match="outside the vocabulary"):
        pipe.submit([1, pipe.cfg.vocab_size + 5], 4)
    with pytest.raises(sp.InputError, match="max_new_tokens must be >= 1"):
        pipe.submit([1, 2], 0)
    with pytest.raises(sp.InputError, match="the context holds 128"):
        pipe.submit(list(range(3, 200)), 4)
    prompt, n, s = reqs[0]
    assert pipe.generate(prompt, n, s).token_ids == alone[0]
