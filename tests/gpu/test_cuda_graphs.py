"""CUDA graph capture/replay and the Triton backend on a real GPU. Skipped without CUDA."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import shapeplan as sp  # noqa: E402
from shapeplan import diagnostics  # noqa: E402
from shapeplan.ops.registry import is_supported  # noqa: E402


def _graph(dtype: str = "float16") -> sp.Graph:
    g = sp.Graph()
    x = g.placeholder("x", dtype, (4, 64))
    t = g.op.Add(x, np.random.randn(64).astype(dtype))
    t = g.op.Mul(t, g.op.Sigmoid(t))
    if is_supported("MatMul"):
        t = g.op.MatMul(t, (np.random.randn(64, 64) / 8).astype(dtype))
    t = g.op.RMSNormalization(t, np.ones(64, dtype), _domain="shapeplan", epsilon=1e-5)
    g.set_outputs(g.op.Tanh(g.op.Mul(t, np.array(0.5, dtype))))
    return g


def _run(engine, x):
    return engine.run({"x": x})[engine.output_names[0]]


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton", "auto"])
def test_replays_and_matches_slot_by_slot_on_cpu(mode):
    g = _graph()
    cpu = sp.compile(g, device="cpu", mode="slot_by_slot")
    eng = sp.compile(g, device="cuda", mode=mode)
    for i in range(6):
        x = torch.randn(4, 64, dtype=torch.float16)
        out = _run(eng, x.cuda())
        ref = _run(cpu, x.float().half())
        torch.testing.assert_close(out.cpu().float(), ref.float(), atol=2e-2, rtol=2e-2)
    info = eng.inspect()
    assert info.phase == "REPLAYING" and info.replay_count >= 1
    assert info.plans()[0]["graph_pool_bytes"] >= 0
    caps = [s["capture"] for s in info.segments if "capture" in s]
    assert caps and all(c["captured"] for c in caps)
    if mode in ("triton", "auto"):
        assert sum(c["fused_steps"] for c in caps) >= 1


def test_outputs_do_not_alias_the_next_replay():
    eng = sp.compile(_graph(), device="cuda", mode="cuda_graphs")
    xs = [torch.randn(4, 64, device="cuda", dtype=torch.float16) for _ in range(8)]
    outs = [_run(eng, x) for x in xs]
    keep = [o.clone() for o in outs]
    _run(eng, torch.randn(4, 64, device="cuda", dtype=torch.float16))
    for o, k in zip(outs, keep):
        assert torch.equal(o, k)
    assert outs[-1].data_ptr() != outs[-2].data_ptr()


def test_capture_oom_defers_then_falls_back():
    from shapeplan.runtime import faults
    diagnostics.enable("ALL")
    diagnostics.reset()
    old = faults.inject("capture_oom")
    g = _graph()
    eng = sp.compile(g, device="cuda", mode="cuda_graphs")
    cpu = sp.compile(g, device="cpu", mode="slot_by_slot")
    try:
        for _ in range(12):
            x = torch.randn(4, 64, dtype=torch.float16)
            torch.testing.assert_close(_run(eng, x.cuda()).cpu().float(), _run(cpu, x).float(), atol=2e-2, rtol=2e-2)
        cats = {e.category for e in diagnostics.events()}
        assert "FALLBACK" in cats and "MEMORY" in cats
        caps = [s["capture"] for s in eng.inspect().segments if "capture" in s]
        assert caps and not any(c["captured"] for c in caps)
    finally:
        faults.inject(*old)
        diagnostics.disable()


def test_variable_address_drift_recaptures():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (8,))
    state = g.variable("state", torch.ones(8))
    g.set_outputs(g.op.Mul(g.op.Add(x, state), x))
    diagnostics.enable("ALL")
    diagnostics.reset()
    try:
        eng = sp.compile(g, device="cuda", mode="cuda_graphs")
        x = torch.randn(8, device="cuda")
        for _ in range(6):
            _run(eng, x)
        eng.variables["state"] = torch.full((8,), 2.0, device="cuda")        # a new address
        for _ in range(6):
            out = _run(eng, x)
        torch.testing.assert_close(out, (x + 2.0) * x)
        assert any(e.category == "GRAPH_REPLAY" and "drift" in e.message for e in diagnostics.events())
    finally:
        diagnostics.disable()


def test_triton_verify_switch(monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_TRITON_VERIFY", "1")
    diagnostics.enable("VERIFY")
    diagnostics.reset()
    try:
        eng = sp.compile(_graph("float32"), device="cuda", mode="triton")
        for _ in range(7):
            _run(eng, torch.randn(4, 64, device="cuda"))
        assert eng.inspect().phase == "REPLAYING"
        assert not [e for e in diagnostics.events() if e.category == "VERIFY"]
    finally:
        diagnostics.disable()


def test_deterministic_mode_turns_tf32_off(monkeypatch):
    from shapeplan.runtime import determinism
    monkeypatch.setenv("SHAPEPLAN_DETERMINISTIC", "1")
    monkeypatch.setenv("SHAPEPLAN_TF32", "1")
    s = determinism.apply()
    try:
        assert s.deterministic and not s.tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
def test_argmax_over_a_vocabulary_matches_torch_when_captured(mode):
    """ArgMax over a 128,256-entry last axis runs in two stages on CUDA (ops/reduce.py): captured and
    replayed it gives torch.argmax's answer, ties and NaNs included."""
    g = sp.Graph()
    x = g.placeholder("x", "float32", (5, 128256))
    g.set_outputs(g.op.ArgMax(x, axis=-1, keepdims=1))
    eng = sp.compile(g, device="cuda", mode=mode)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):                                  # through warm-up, capture and replay
        v = torch.randn(5, 128256, generator=gen)
        v[1] = (v[1] * 2).round()
        v[2, torch.randint(0, 128256, (3,), generator=gen)] = float("nan")
        v[3] = 1.0
        v[4, -1] = 100.0
        v = v.cuda()
        got = _run(eng, v)
        assert torch.equal(got, torch.argmax(v, -1, keepdim=True))


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
def test_a_collection_during_capture_does_not_destroy_graphs_mid_capture(mode):
    """An engine dropped in a reference cycle holds captured CUDA graphs until Python's cyclic GC runs.
    Destroying a graph is not permitted while another is being captured (it invalidates the capture and
    leaves the stream capturing), and torch.cuda.graph no longer collects first; so no collection may run
    during our capture. Here the collector is set to run after every allocation, with a dead engine's
    graphs waiting for it."""
    g = _graph()
    x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    old = sp.compile(g, device="cuda", mode=mode)
    for _ in range(4):
        _run(old, x)
    assert old.inspect().phase == "REPLAYING"
    old.cycle = old                                  # unreachable after `del`, collectable only by the GC
    del old
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        eng = sp.compile(g, device="cuda", mode=mode)
        ref = sp.compile(g, device="cuda", mode="slot_by_slot")
        for _ in range(4):
            out = _run(eng, x)
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert eng.inspect().phase == "REPLAYING"
    torch.testing.assert_close(out, _run(ref, x), atol=2e-2, rtol=2e-2)
    torch.cuda.synchronize()


def test_graph_pools_reserved_counts_captured_plans_only():
    """``graph_pools_reserved`` (the figure ``shapeplan bench`` prints for its captured plans): it grows by what a
    capture allocates in its pool, and a large tensor outside the graphs freed and released afterwards leaves it
    alone (a difference of ``memory_reserved`` went negative there, thirtieth session). The growth is checked on a
    capture that must allocate 8 MiB; an engine's plan may allocate nothing in its pool (its registers are made before
    capture), and in a suite a pool segment left free by an earlier test can serve it, so for the engine the figure
    may only not shrink (it stayed equal in the thirty-first session's GPU run)."""
    from shapeplan.runtime.backends.cuda_graphs import graph_pools_reserved
    dev = torch.device("cuda")
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    other = torch.empty(64 * 2**20, dtype=torch.uint8, device=dev)            # 64 MiB in the default pool
    before = graph_pools_reserved(dev)
    src = torch.ones(2 * 2**20, device=dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):
        made = src * 2                                                      # 8 MiB allocated inside the graph's pool
    g.replay()
    captured = graph_pools_reserved(dev)
    assert captured >= before + made.numel() * made.element_size()
    eng = sp.compile(_graph(), device="cuda", mode="cuda_graphs")
    for _ in range(4):
        _run(eng, torch.randn(4, 64, device="cuda", dtype=torch.float16))
    assert eng.inspect().phase == "REPLAYING"
    with_engine = graph_pools_reserved(dev)
    assert with_engine >= captured
    del other
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert graph_pools_reserved(dev) == with_engine
    assert float(made[0]) == 2.0
