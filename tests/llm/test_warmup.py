"""The pipeline's CUDA warm-up thread (shapeplan/llm/warmup.py), checked on CPU: its body runs the
one-layer copy slot by slot and records nothing; it is off on CPU and with SHAPEPLAN_CUDA_WARM=0; a
failure is recorded once and raises nothing."""
from __future__ import annotations

import threading

import torch

from shapeplan import diagnostics
from shapeplan.llm import warmup
from shapeplan.llm.config import preset_config


def test_small_config_keeps_the_kernel_shapes():
    cfg = preset_config("llama-1b", "bfloat16")
    small = warmup.small_config(cfg)
    assert small.num_layers == 1 and small.vocab_size == warmup.WARM_VOCAB
    assert (small.hidden_size, small.intermediate_size, small.num_heads, small.num_kv_heads, small.head_dim) == \
        (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)


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


def test_a_failure_is_recorded_and_not_raised(monkeypatch):
    import shapeplan.llm.model as model
    cfg = preset_config("llama-tiny", "float32")

    def broken(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("no graph today")
    monkeypatch.setattr(model, "build_graph", broken)
    diagnostics.reset()
    diagnostics.enable(["FALLBACK"])
    try:
        warmup._run(cfg, torch.float32, torch.device("cpu"), 64, 16)
        evs = diagnostics.events()
        assert len(evs) == 1 and "no graph today" in evs[0].fields["reason"]
    finally:
        diagnostics.disable()
        diagnostics.reset()
