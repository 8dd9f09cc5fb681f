"""The pipeline on CUDA (skipped without a GPU): every GPU mode matches slot_by_slot and transformers
in float32, the decode plan replays, a bf16 preset runs sessions and sampling, and the batched engine
gives each request the tokens it gets alone and in slot_by_slot."""
from __future__ import annotations

import random

import pytest
import torch

from shapeplan.llm import GenerationPipeline, Sampling
from tests.llm.conftest import hf_greedy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPT = "Explain KV caching: keys and values"
KW = dict(device="cuda", max_prefill_length=64, max_kv_cache_length=160, progress=False)


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton", "auto"])
def test_gpu_modes_match_slot_by_slot_and_transformers(mode, checkpoints, hf_models):
    path = checkpoints("llama")
    ref = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", **KW)
    pipe = GenerationPipeline.from_pretrained(path, mode=mode, **KW)
    want = ref.generate(PROMPT, max_new_tokens=32)
    for _ in range(2):                                  # the second request replays captured plans
        got = pipe.generate(PROMPT, max_new_tokens=32)
        assert got.token_ids == want.token_ids
    assert want.token_ids == hf_greedy(hf_models(path), want.prompt_token_ids, 32)
    with pipe.start_session() as s:
        s.generate(PROMPT, max_new_tokens=16)
        cont = s.generate(" Once upon a time", max_new_tokens=16)
    with ref.start_session() as s:
        s.generate(PROMPT, max_new_tokens=16)
        assert s.generate(" Once upon a time", max_new_tokens=16).token_ids == cont.token_ids
    if mode == "cuda_graphs":
        import shapeplan.testing as spt
        pipe.generate(PROMPT, max_new_tokens=8)
        spt.assert_fully_replaying(pipe.engine)


def test_gpu_bf16_preset_sessions_and_sampling():
    pipe = GenerationPipeline.from_preset("llama-tiny", device="cuda", dtype="bfloat16", mode="auto",
                                          max_prefill_length=32, max_kv_cache_length=128)
    prompt = list(range(3, 20))
    a = pipe.generate(prompt, max_new_tokens=40, sampling=Sampling.random(temperature=0.9, top_p=0.9, seed=7))
    b = pipe.generate(prompt, max_new_tokens=40, sampling=Sampling.random(temperature=0.9, top_p=0.9, seed=7))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 40
    assert a.metrics.late_steady_tok_s > 0
    with pipe.start_session() as s:
        s.generate(prompt, max_new_tokens=8)
        res = s.generate([5, 6, 7], max_new_tokens=200)
    assert res.finish_reason == "length"
    assert pipe.batch.async_rounds > 0            # a lone stream's rounds launch ahead on a GPU (SHAPEPLAN_LAUNCH_AHEAD)
    pipe.batch.launch_ahead = False
    c = pipe.generate(prompt, max_new_tokens=40, sampling=Sampling.random(temperature=0.9, top_p=0.9, seed=7))
    assert c.token_ids == a.token_ids


def test_gpu_cuda_warmup_thread_changes_nothing(monkeypatch, tmp_path):
    """The CUDA warm-up thread (shapeplan/llm/warmup.py) runs beside construction, finishes, records no
    events, and the tokens are those of a pipeline built without it. Each pipeline gets an empty cache:
    with frozen-plan records the warm-up window is used to prepare plans (another test covers that)."""
    import threading

    from shapeplan import diagnostics

    def run(warm: str) -> tuple[list[int], list[str]]:
        monkeypatch.setenv("SHAPEPLAN_CUDA_WARM", warm)
        monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / f"warm{warm}"))
        diagnostics.reset()
        diagnostics.enable(["COMPILE", "SHAPE", "FALLBACK"], level="detailed")
        try:
            pipe = GenerationPipeline.from_preset("llama-tiny", device="cuda", dtype="bfloat16", mode="triton",
                                                  max_prefill_length=32, max_kv_cache_length=128)
            toks = pipe.generate(list(range(5, 25)), max_new_tokens=12).token_ids
            for t in threading.enumerate():
                if t.name == "shapeplan-cuda-warm":
                    t.join(timeout=60)
                    assert not t.is_alive()
            evs = diagnostics.events()
            assert not [e for e in evs if "warm-up thread failed" in e.message]
            return toks, [e.message for e in evs if e.category in ("COMPILE", "SHAPE") and "plan" in e.message]
        finally:
            diagnostics.disable()
            diagnostics.reset()

    with_warm, events_warm = run("1")
    without, events_plain = run("0")
    assert with_warm == without
    assert events_warm == events_plain            # the warm-up's own plans were not recorded


@pytest.mark.parametrize("model_type", ["mistral", "phi3"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_gpu_streamed_weights_equal_memory_map(checkpoints, monkeypatch, dtype, model_type):
    """Weights read straight into device memory (pinned staging, per-thread streams; llm/stream_load.py),
    pieces smaller than the tensors, a sharded checkpoint, a dtype converted on the device, Phi-3's fused
    q/k/v and gate/up read as their parts: the tensors the memory-mapped path copies."""
    from shapeplan.llm import LlamaConfig, stream_load
    from shapeplan.llm.weights import load_weights
    monkeypatch.setattr(stream_load, "CHUNK", 8192)
    path = checkpoints(model_type)
    cfg = LlamaConfig.from_file(path)
    want = load_weights(path, cfg, device="cuda", dtype=dtype or cfg.torch_dtype, stream=False, progress=False)
    got = load_weights(path, cfg, device="cuda", dtype=dtype or cfg.torch_dtype, stream=True, progress=False)
    assert list(got) == list(want)
    for name, t in want.items():
        assert got[name].device.type == "cuda" and got[name].dtype == t.dtype and torch.equal(got[name], t), name


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_gpu_warmup_during_load_changes_nothing(checkpoints, monkeypatch, tmp_path, dtype):
    """from_pretrained's CUDA warm-up started before the weights load (it reads the LM head while that
    loads) gives the tokens of a pipeline whose warm-up starts after it."""
    path = checkpoints("llama")
    out = {}
    for early in ("1", "0"):
        monkeypatch.setenv("SHAPEPLAN_WARM_DURING_LOAD", early)
        monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / early))
        pipe = GenerationPipeline.from_pretrained(path, mode="triton", dtype=dtype, **KW)
        assert ("warm-up start" in pipe.timings) == (early == "1")
        out[early] = pipe.generate(PROMPT, max_new_tokens=32).token_ids
        pipe.close()
    assert out["1"] == out["0"]


@pytest.mark.parametrize("mode,attention", [("cuda_graphs", "auto"), ("triton", "auto"), ("triton", "sdpa")])
def test_gpu_a_warm_start_freezes_from_records_and_gives_the_same_tokens(mode, attention, checkpoints, tmp_path,
                                                                          monkeypatch):
    """The second pipeline's plans freeze from the first one's frozen-plan records (runtime/
    frozen_records.py), during its warm-up (``Engine.prepare``) or at their first call: one lifecycle
    call per plan instead of three, the same greedy tokens. In triton mode a segment with generated
    Triton steps is captured before any eager run (every step's verdict is on disk) and one replay
    gives the call's results;
    ``sdpa``: the prefill attention through SDPA's own choice (cuDNN on Hopper), whose first call on
    this thread then happens inside that capture."""
    from shapeplan import diagnostics
    from shapeplan.ops import llm as llm_ops
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(llm_ops, "_PREFILL_ATTENTION", attention)
    path = checkpoints("llama")
    first = GenerationPipeline.from_pretrained(path, mode=mode, **KW).generate(PROMPT, max_new_tokens=24)
    assert len(list((tmp_path / "frozen").glob("*.json"))) == 2           # prefill and decode plans
    diagnostics.reset()                              # events of earlier tests stay until reset
    diagnostics.enable(["LIFECYCLE", "SEGMENT", "CACHE", "FALLBACK", "SHAPE", "GRAPH_REPLAY"], level="detailed")
    try:
        pipe = GenerationPipeline.from_pretrained(path, mode=mode, **KW)
        again = pipe.generate(PROMPT, max_new_tokens=24)
        events = [(e.message, e.fields.get("plan")) for e in diagnostics.events()]
    finally:
        diagnostics.disable()
    msgs = [m for m, _ in events]
    assert again.token_ids == first.token_ids
    new_plans = {p for m, p in events if m == "new shape signature: new plan"}
    from_record = {p for m, p in events if m == "shapes frozen from a frozen-plan record"}
    used = {p for m, p in events if m == "segment captured"}
    assert len(used) == 2 and used <= from_record == new_plans, events  # each plan from its record
    assert "segment warmed up" not in msgs and "frozen-plan record not usable: recording" not in msgs, events
    assert not [m for m in msgs if "FALLBACK" in m or "failed" in m], events
    if mode == "triton":    # a segment with generated Triton steps whose verdicts are on disk is captured
        # before any eager run; one of op kernels only (the fused GEMVs, the paged attention) runs once first,
        # which loads its kernels (as in cuda_graphs mode)
        first = msgs.count("captured before any eager run; replayed for this call")
        assert first + msgs.count("eager run before capture done") == 2, events
    ref = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", **KW).generate(PROMPT, max_new_tokens=24)
    assert again.token_ids == ref.token_ids


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
def test_gpu_batched_equals_alone_and_slot_by_slot(mode, checkpoints):
    path = checkpoints("llama")
    kw = dict(device="cuda", max_prefill_length=64, max_kv_cache_length=160, progress=False, max_num_seqs=8)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.choice([4, 17, 40, 70]))] for _ in range(8)]
    samp = [Sampling.greedy() if i % 2 else Sampling.random(temperature=0.8, seed=i) for i in range(8)]
    samp[2] = Sampling(presence_penalty=1.0, frequency_penalty=0.5, logit_bias={5: 2.0})   # the additive terms,
    samp[4] = Sampling.random(temperature=0.8, seed=4, frequency_penalty=0.7)             # greedy and drawn
    ref = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", **kw)
    want = [ref.generate(p, 20, s).token_ids for p, s in zip(prompts, samp)]
    pipe = GenerationPipeline.from_pretrained(path, mode=mode, **kw)
    pipe.warmup()
    assert [pipe.generate(p, 20, s).token_ids for p, s in zip(prompts, samp)] == want
    rounds = pipe.batch.async_rounds
    assert [r.token_ids for r in pipe.generate_batch(prompts, 20, samp)] == want
    assert pipe.batch.async_rounds > rounds       # a batch's rounds launch ahead on a GPU (SHAPEPLAN_LAUNCH_AHEAD)


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
def test_gpu_logprobs_in_captured_plans(mode, checkpoints):
    """Requests with logprobs beside requests without, on captured plans: everyone's tokens are those of
    the default plans, and each logprob is the log-softmax of ``pipe.score``'s logits (float32)."""
    path = checkpoints("llama")
    pipe = GenerationPipeline.from_pretrained(path, mode=mode, max_num_seqs=8, **KW)
    pipe.warmup()
    prompts = [pipe.encode(t) for t in ("Hello world", "The quick brown fox", "Explain KV caching", "0 1 2 3")]
    want = [pipe.generate(p, 16).token_ids for p in prompts]
    handles = [pipe.submit(p, 16, logprobs=5 if i % 2 else None) for i, p in enumerate(prompts)]
    for i, (h, p) in enumerate(zip(handles, prompts)):
        lps = [lp for ev in h for lp in ev.logprobs or ()]
        assert h.token_ids == want[i]
        if i % 2:
            ref = torch.log_softmax(pipe.score(p + h.token_ids[:-1]).float(), dim=-1)
            for j, (t, lp) in enumerate(zip(h.token_ids, lps)):
                assert lp.logprob == pytest.approx(ref[len(p) - 1 + j, t].item(), abs=1e-3)
                assert lp.top[0][0] == t and len(lp.top) == 5


def test_gpu_copy_bandwidth_is_the_h200_figure_there_and_measured_elsewhere(capsys):
    """The benchmarks' bandwidth floor: the issues' 4.23 TB/s on an H200; on another card a copy timed there
    (read + write counted), within what HBM can do, and printed."""
    from shapeplan.llm.bench import H200_COPY_BANDWIDTH, copy_bandwidth
    bw = copy_bandwidth()
    if "H200" in torch.cuda.get_device_name():
        assert bw == H200_COPY_BANDWIDTH
    else:
        assert 1e10 < bw < 2e13
        assert "copy bandwidth for the floor" in capsys.readouterr().out
