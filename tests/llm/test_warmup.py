"""The pipeline's CUDA warm-up thread (shapeplan/llm/warmup.py), checked on CPU: its body calls the
kernels of the real prefill plan and records nothing; it is off on CPU and with SHAPEPLAN_CUDA_WARM=0; a
failure is recorded once and raises nothing."""
from __future__ import annotations

import threading

import pytest
import torch

from shapeplan import diagnostics
from shapeplan.llm import warmup
from shapeplan.llm.config import preset_config


def _spy_lookups(monkeypatch) -> set[str]:  # noqa: ANN001
    """The op names ``registry.lookup`` is asked for from now on (the set fills as it is called)."""
    from shapeplan.ops import registry
    used: set[str] = set()
    real = registry.lookup

    def spy(op, domain="", opset=None):  # noqa: ANN001, ANN202
        used.add(op)
        return real(op, domain, opset)
    monkeypatch.setattr(registry, "lookup", spy)
    return used


def test_the_warm_layer_runs_the_kernels_of_the_real_prefill_plan(monkeypatch):
    """Every kernel-launching op of the pipeline's prefill plan is one the warm-up calls (guards drift
    between model.build_graph and warmup.layer)."""
    from shapeplan.llm import GenerationPipeline
    from shapeplan.ops import registry
    real = registry.lookup
    used = _spy_lookups(monkeypatch)
    cfg = preset_config("llama-tiny", "float32")
    tok = warmup.layer(cfg, torch.float32, torch.device("cpu"), 64, 16)
    assert tok.shape == (1, 1) and tok.dtype == torch.int64
    monkeypatch.setattr(registry, "lookup", real)
    pipe = GenerationPipeline.from_preset("llama-tiny", dtype="float32", max_prefill_length=16,
                                          max_kv_cache_length=64)
    plan = pipe.engine.plan(["next_token", "next_position"])
    shape_only = {"Reshape", "Split", "Transpose", "Add", "Sub", "Identity", "Squeeze", "Unsqueeze", "Concat"}
    assert {s.op_type for s in plan.slots} - shape_only <= used


def test_the_body_runs_and_records_nothing_while_other_threads_still_record():
    cfg = preset_config("llama-tiny", "float32")
    diagnostics.reset()
    diagnostics.enable("ALL", level="full")
    try:
        warmup._run(cfg, torch.float32, torch.device("cpu"), 64, 16)
        assert diagnostics.events() == []
        with diagnostics.muted():
            t = threading.Thread(target=lambda: diagnostics.record("COMPILE", "from another thread"))
            t.start()
            t.join()
            diagnostics.record("COMPILE", "muted here")
        assert [e.message for e in diagnostics.events()] == ["from another thread"]
    finally:
        diagnostics.disable()
        diagnostics.reset()


def test_off_on_cpu_and_by_setting(monkeypatch):
    cfg = preset_config("llama-tiny", "float32")
    assert warmup.start(cfg, torch.float32, torch.device("cpu"), 64, 16) is None
    monkeypatch.setenv("SHAPEPLAN_CUDA_WARM", "0")
    assert not warmup.enabled()
    assert warmup.start(cfg, torch.float32, torch.device("cuda"), 64, 16) is None
    monkeypatch.setenv("SHAPEPLAN_CUDA_WARM", "1")
    assert warmup.enabled()


@pytest.mark.parametrize("threads", ["1", "4"])
def test_a_failure_is_recorded_and_not_raised(monkeypatch, threads):
    cfg = preset_config("llama-tiny", "float32")
    ran = []

    def broken():  # noqa: ANN202
        raise RuntimeError("no graph today")

    def fine():  # noqa: ANN202
        ran.append(threading.current_thread().name)
    monkeypatch.setattr(warmup, "parts", lambda *a, **k: [fine, broken, fine])
    monkeypatch.setenv("SHAPEPLAN_CUDA_WARM_THREADS", threads)
    diagnostics.reset()
    diagnostics.enable(["FALLBACK"])
    try:
        warmup._run(cfg, torch.float32, torch.device("cpu"), 64, 16)
        evs = diagnostics.events()
        assert len(evs) == 1 and "no graph today" in evs[0].fields["reason"]
        assert len(ran) == 2                      # the other parts still ran
        assert (len(set(ran)) == 2) == (threads == "4")
    finally:
        diagnostics.disable()
        diagnostics.reset()


def test_a_replay_only_warm_up_leaves_out_the_kernels_triton_replaces(monkeypatch):
    """With frozen-plan records a triton-mode plan never runs the torch kernels of its norms, RoPE of q,
    SiLU*mul: the replay-only warm-up does not look them up (nor load them); the prefill's KV cache write
    stays a torch kernel (the Triton one writes one position), so it is warmed."""
    used = _spy_lookups(monkeypatch)
    cfg = preset_config("llama-tiny", "float32")
    tok = warmup.layer(cfg, torch.float32, torch.device("cpu"), 64, 16, replay_only=True)
    assert tok.shape == (1, 1)
    assert not used & set(warmup._TRITON_IN_REPLAY)
    assert {"MatMul", "Gather", "PagedWriteAttention", "PagedCacheWrite", "ArgMax"} <= used


def test_the_warm_up_reads_the_models_head_at_its_real_size():
    """Given the model's LM head, the warm layer's logits span the whole vocabulary (the GEMM and ArgMax
    shapes of the real plan) and the weight is only read."""
    import dataclasses
    cfg = dataclasses.replace(preset_config("llama-tiny", "float32"), vocab_size=4 * warmup.WARM_VOCAB)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    before = head.clone()
    seen = []
    from shapeplan.ops import registry
    real_argmax = registry.lookup("ArgMax", "").kernel

    def spy(x, **kw):  # noqa: ANN001, ANN202
        seen.append(tuple(x.shape))
        return real_argmax(x, **kw)
    orig = registry.lookup

    def lookup(op, domain="", opset=None):  # noqa: ANN001, ANN202
        d = orig(op, domain, opset)
        return type("D", (), {"kernel": staticmethod(spy)})() if op == "ArgMax" else d
    registry.lookup = lookup
    try:
        warmup.layer(cfg, torch.float32, torch.device("cpu"), 64, 16, head=head)
        warmup.layer(cfg, torch.float32, torch.device("cpu"), 64, 16, head=head[:, :8])   # wrong shape: ignored
    finally:
        registry.lookup = orig
    assert seen == [(1, cfg.vocab_size), (1, warmup.WARM_VOCAB)]
    assert torch.equal(head, before)


def test_the_short_switch_interval_is_counted_and_restored(monkeypatch):
    import sys
    monkeypatch.setenv("SHAPEPLAN_STARTUP_SWITCH_INTERVAL", "0.0003")
    before = sys.getswitchinterval()
    a = warmup.short_switch_interval()
    b = warmup.short_switch_interval()
    assert abs(sys.getswitchinterval() - 0.0003) < 1e-9
    a()
    a()                                                   # idempotent: b still holds it
    assert abs(sys.getswitchinterval() - 0.0003) < 1e-9
    b()
    assert sys.getswitchinterval() == before
    monkeypatch.setenv("SHAPEPLAN_STARTUP_SWITCH_INTERVAL", "0")
    warmup.short_switch_interval()()
    assert sys.getswitchinterval() == before


def test_a_pipeline_prepares_its_plans_from_records_while_the_warm_up_runs(tmp_path, monkeypatch):
    """CPU stand-in for the CUDA start-up (records are on by default there): with records of a first
    pipeline's plans, a second one prepares the greedy decode and prefill plans while its warm-up thread
    is alive; its first request then runs them frozen from the records, with the same tokens."""
    from shapeplan.llm import GenerationPipeline, Sampling
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SHAPEPLAN_FROZEN_RECORDS", "1")
    kw = dict(device="cpu", dtype="float32", mode="emulated_replay", max_prefill_length=16, max_kv_cache_length=64)
    prompt = list(range(3, 14))
    first = GenerationPipeline.from_preset("llama-tiny", **kw)
    want = first.generate(prompt, max_new_tokens=12, sampling=Sampling.greedy()).token_ids
    pipe = GenerationPipeline.from_preset("llama-tiny", **kw)
    release = threading.Event()
    pipe._warm_thread = threading.Thread(target=release.wait, daemon=True)
    pipe._warm_thread.start()
    bucket = pipe.runner.prefill_bucket(len(prompt), 0, 64)
    rows = pipe.decode_buckets[0]
    diagnostics.reset()
    diagnostics.enable(["LIFECYCLE", "SEGMENT"], level="detailed")
    try:
        pipe.batch.call(lambda: pipe._prepare_from_records(bucket))   # plans belong to the engine thread
        prepared = [e.fields for e in diagnostics.events() if e.message.startswith("plan prepared")]
        release.set()
        got = pipe.generate(prompt, max_new_tokens=12, sampling=Sampling.greedy()).token_ids
        msgs = [e.message for e in diagnostics.events()]
    finally:
        diagnostics.disable()
    assert [(p["outputs"], p["rows"], p["tokens"]) for p in prepared] == [("next_token", rows, 1),
                                                                         ("next_token", 1, bucket)]
    assert got == want
    assert "segment warmed up" not in msgs                       # both plans came from their records
    pipe._warm_thread = None
    again = pipe.batch.call(lambda: pipe.engine.prepare(pipe.runner.padding_feeds(rows, 1),
                                                        outputs=["next_token", "next_position"]))
    assert again is False                                        # in use already


def test_the_pipeline_state_is_made_once_and_kept_without_copies():
    """model.initial_state: every KV cache is a view of one zero buffer, and the engine keeps those views
    (and the sampling state) as its variables instead of copying them (adopt_variables)."""
    from shapeplan.llm import GenerationPipeline
    pipe = GenerationPipeline.from_preset("llama-tiny", device="cpu", dtype="float32", mode="emulated_replay",
                                          max_prefill_length=16, max_kv_cache_length=64)
    var = pipe.engine.variables
    caches = [var[f"{kv}_cache_{i}"] for i in range(pipe.cfg.num_layers) for kv in "kv"]
    assert len({c.untyped_storage().data_ptr() for c in caches}) == 1
    assert all(var[v.name] is v.data for v in pipe.engine.graph.variables)
    assert not any(c.any() for c in caches)
    pipe.generate(list(range(3, 9)), max_new_tokens=4)
    assert any(c.any() for c in caches)                       # the engine wrote into that buffer


def test_a_large_cpu_pool_is_zeroed_by_the_os(monkeypatch):
    """model.zeros: from LAZY_ZERO_BYTES on, a CPU buffer is numpy's calloc'd memory (zero pages until
    written; torch.zeros wrote all 2.1 GB of llama-1b's pool at construction); zeros all the same, and the
    pipeline on it generates what it generates on torch.zeros' buffer."""
    from shapeplan.llm import GenerationPipeline, model
    z = model.zeros((3, 1 << 13, 4096), torch.bfloat16, "cpu")               # 192 MB: the lazy path
    assert z.shape == (3, 1 << 13, 4096) and z.dtype == torch.bfloat16 and z.is_contiguous()
    assert not z.any() and z.untyped_storage().nbytes() == 3 * (1 << 13) * 4096 * 2
    z[1, 5] = 1.5
    assert z.sum().item() == 1.5 * 4096
    small = model.zeros((2, 3), torch.float32, "cpu")
    assert torch.equal(small, torch.zeros(2, 3))

    def run(threshold: int) -> list[int]:
        monkeypatch.setattr(model, "LAZY_ZERO_BYTES", threshold)
        pipe = GenerationPipeline.from_preset("llama-tiny", device="cpu", dtype="float32", mode="emulated_replay",
                                              max_prefill_length=16, max_kv_cache_length=64)
        kv = pipe.engine.variables["k_cache_0"]
        assert not kv.any()
        return pipe.generate(list(range(3, 9)), max_new_tokens=6).token_ids
    assert run(0) == run(1 << 62)
