"""Phase machine, per-segment states, plan selection by shape, variables, constants."""
from __future__ import annotations

import numpy as np
import pytest

import shapeplan as sp
from shapeplan import testing
from tests.runtime.graphs import mlp, rand, ref_engine, transformer_stack, with_gap, with_state


def test_replaying_by_fifth_call():
    g = mlp()
    e, ref = sp.Engine(g, mode="emulated_replay"), ref_engine(g)
    phases, states = [], []
    for i in range(5):
        x = rand(4, 8, seed=i)
        out = e.run({"x": x})
        assert np.array_equal(out[g.outputs[0].name], ref.run({"x": x})[g.outputs[0].name])
        info = e.inspect()
        phases.append(info.phase)
        states.append(info.segments[0]["state"])
    # call 1 records shapes (slot by slot) and freezes; call 2 warms up and compiles; call 3 captures
    assert phases == ["SHAPES_FROZEN", "SHAPES_FROZEN", "REPLAYING", "REPLAYING", "REPLAYING"]
    assert states == ["NEEDS_WARMUP", "CAPTURE_PENDING", "REPLAYING", "REPLAYING", "REPLAYING"]
    info = e.inspect()
    assert info.capture_count == 1 and info.replay_count == 2
    testing.assert_fully_replaying(e)
    testing.assert_no_address_drift(e)
    testing.assert_no_capture_failures(e)


def test_explicit_freeze_and_configurable_warmup():
    e = sp.Engine(mlp(), mode="emulated_replay", warmup_calls=100)
    with pytest.raises(sp.LifecycleError):
        e.freeze()
    for _ in range(3):
        e.run({"x": rand(2, 8)})
    assert e.inspect().phase == "SLOT_BY_SLOT"
    e.freeze()
    assert e.inspect().phase == "SHAPES_FROZEN"
    testing.assert_phase_reached(e, "SHAPES_FROZEN")


def test_shape_change_selects_another_plan_never_mutates_frozen_one():
    g = mlp()
    e, ref = sp.Engine(g, mode="emulated_replay"), ref_engine(g)
    for i in range(5):
        e.run({"x": rand(4, 8, seed=i)})
    first = e.inspect().runner
    assert first.phase.value == "REPLAYING"
    x = rand(7, 8, seed=9)
    out = e.run({"x": x})
    assert np.array_equal(out[g.outputs[0].name], ref.run({"x": x})[g.outputs[0].name])
    assert e.inspect().runner is not first and e.inspect().phase == "SHAPES_FROZEN"
    assert first.phase.value == "REPLAYING" and first.calls == 5
    assert len(e.inspect().plans()) == 2
    x = rand(4, 8, seed=10)
    assert np.array_equal(e.run({"x": x})[g.outputs[0].name], ref.run({"x": x})[g.outputs[0].name])
    assert e.inspect().runner is first and first.segments[0].replays == 3


def test_slot_by_slot_mode_never_freezes():
    e = sp.Engine(mlp(), mode="slot_by_slot")
    for i in range(6):
        e.run({"x": rand(2, 8, seed=i)})
    assert e.inspect().phase == "SLOT_BY_SLOT"


def test_variables_persist_and_are_updated_in_place():
    g = with_state()
    e, ref = sp.Engine(g, mode="emulated_replay"), ref_engine(g)
    ptr = e.variables["acc"].data_ptr()
    for i in range(8):
        x = rand(5, seed=i)
        a, b = e.run({"x": x}), ref.run({"x": x})
        assert np.array_equal(a[g.outputs[0].name], b[g.outputs[0].name])
    assert e.variables["acc"].data_ptr() == ptr
    assert np.array_equal(e.variables["acc"].numpy(), ref.variables["acc"].numpy())
    testing.assert_fully_replaying(e)


def test_replaced_variable_is_address_drift_recaptured(diag):
    import torch
    g = with_state()
    e, ref = sp.Engine(g, mode="emulated_replay"), ref_engine(g)
    for i in range(5):
        e.run({"x": rand(5, seed=i)}), ref.run({"x": rand(5, seed=i)})
    e.variables["acc"] = e.variables["acc"].clone()          # new address
    ref.variables["acc"] = ref.variables["acc"].clone()
    for i in range(5, 9):
        a, b = e.run({"x": rand(5, seed=i)}), ref.run({"x": rand(5, seed=i)})
        assert np.array_equal(a[g.outputs[0].name], b[g.outputs[0].name])
    drift = [ev for ev in diag.events("GRAPH_REPLAY") if "drift" in ev.message]
    assert drift and drift[0].fields["changed"] == ["acc"]
    assert e.inspect().segments[0]["state"] == "REPLAYING" and e.inspect().segments[0]["captures"] == 2
    assert isinstance(e.variables["acc"], torch.Tensor)


def test_replaced_weight_is_rejected_and_engine_recovers():
    g = mlp()
    e = sp.Engine(g, mode="emulated_replay")
    for i in range(5):
        e.run({"x": rand(2, 8, seed=i)})
    w = g.values["w0"]
    orig = w.data
    w.data = orig.clone() * 2
    with pytest.raises(sp.LifecycleError, match="w0"):
        e.run({"x": rand(2, 8)})
    w.data = orig
    e.run({"x": rand(2, 8)})


def test_gap_segments_and_dynamic_sizes_fall_back_visibly(diag):
    g = with_gap()
    e, ref = sp.Engine(g, mode="emulated_replay", max_recaptures=2), ref_engine(g)
    for i in range(12):
        x = rand(6, 4, seed=i)          # NonZero's output size changes from call to call
        a, b = e.run({"x": x}), ref.run({"x": x})
        for k in b:
            assert np.array_equal(a[k], b[k]), (i, k)
    segs = e.inspect().segments
    assert [s["capturable"] for s in segs] == [True, False, True]
    assert segs[1]["state"] == "GAP" and segs[0]["state"] == "REPLAYING"
    assert e.inspect().phase == "REPLAYING"
    recs = {(r["segment"], r["state"]) for r in diag.segment_records()}
    assert (1, "GAP") in recs or any(s == "FAILED" for _, s in recs)


def test_shape_inference_only():
    g = transformer_stack(layers=2)
    e = sp.Engine(g, mode="shape_inference_only")
    out = e.run({"x": rand(8, 16)})
    spec = out[g.outputs[0].name]
    assert spec.shape == (8, 16) and spec.dtype.name == "float32"


def test_dtype_change_raises_input_error_and_engine_stays_usable():
    g = mlp()
    e = sp.Engine(g, mode="emulated_replay")
    e.run({"x": rand(2, 8)})
    with pytest.raises(sp.InputError, match="'x'.*float32.*float64|'x'.*expected dtype"):
        e.run({"x": rand(2, 8).astype(np.float64)})
    with pytest.raises(sp.InputError, match="missing"):
        e.run({})
    assert e.run({"x": rand(2, 8)})[g.outputs[0].name].shape == (2, 8)


def test_outputs_are_not_overwritten_by_later_calls():
    g = mlp()
    e = sp.Engine(g, mode="emulated_replay")
    outs = [e.run({"x": rand(2, 8, seed=i)})[g.outputs[0].name] for i in range(7)]
    ref = ref_engine(g)
    for i, o in enumerate(outs):
        assert np.array_equal(o, ref.run({"x": rand(2, 8, seed=i)})[g.outputs[0].name])


@pytest.mark.parametrize("mode", ["emulated_replay", "slot_by_slot"])
def test_outputs_fed_back_in_place_give_the_copied_loops_values(mode):
    """An output fed back as the next call's input (a decode loop): written into the plan's input buffer
    (``input_buffers``) from ``run(copy=False)``'s output buffer, the values are those of the plain loop.
    Before the plan freezes (and in slot_by_slot, which never freezes) there is no buffer to write into."""
    import torch
    g = mlp()
    name = g.outputs[0].name
    e, ref = sp.Engine(g, mode=mode), ref_engine(g)
    x0 = torch.from_numpy(rand(2, 8, seed=3))
    assert e.input_buffers({"x": x0}) == {}                   # no plan for this shape yet
    want, x = [], x0
    for _ in range(9):
        x = ref.run({"x": x})[name]
        want.append(x.clone())
    for _ in range(4):                                          # record, freeze, warm up, capture
        e.run({"x": x0})
    stage = e.input_buffers({"x": x0})
    if mode == "slot_by_slot":
        assert stage == {}
        return
    buf = stage["x"]
    buf.copy_(x0)
    (runner,) = e.runners()
    got = []
    for _ in range(9):
        out = e.run({"x": buf}, copy=False)[name]
        assert out is runner.regs[runner._out_regs[0]]            # the plan's own buffer, not a copy
        got.append(out.clone())
        buf.copy_(out)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    fresh = e.run({"x": x0})[name]                               # copy=True: the caller's own tensor
    assert fresh is not e.run({"x": x0})[name] and torch.equal(fresh, want[0])
    with pytest.raises(sp.InputError, match=r"missing input\(s\) \['x'\]"):
        e.input_buffers({"y": x0})


def test_torch_in_torch_out():
    import torch
    g = mlp()
    e = sp.Engine(g, mode="emulated_replay")
    for i in range(5):
        out = e.run({"x": torch.from_numpy(rand(2, 8, seed=i))})
    assert isinstance(out[g.outputs[0].name], torch.Tensor)


def test_inspect_report_and_dot_are_complete():
    import json
    e = sp.Engine(with_gap(), mode="emulated_replay")
    for _ in range(5):
        e.run({"x": np.ones((3, 4), np.float32)})
    info = e.inspect()
    rep = info.report()
    json.dumps(rep)
    assert rep["phase"] == "REPLAYING" and rep["captures"] >= 1 and rep["replays"] >= 1
    assert all({"op_type", "inputs", "outputs", "release", "segment"} <= set(s) for s in rep["slots"])
    dot = info.to_dot()
    assert dot.startswith("digraph") and "cluster_1" in dot and "REPLAYING" in dot


def _two_states(a, b) -> sp.Graph:  # noqa: ANN001
    from tests.runtime.graphs import op
    g = sp.Graph("two_states")
    o = op(g)
    x = g.placeholder("x", "float32", ("n",))
    y = o.Add(o.Accumulate(g.variable("a", a), o.Relu(x)), o.Accumulate(g.variable("b", b), o.Tanh(x)))
    g.set_outputs(y)
    return g


def test_adopted_variables_are_the_graphs_own_tensors():
    """``adopt_variables=True``: a variable's initial tensor becomes the engine's state without a copy
    when it can (views of one buffer, as the LLM pipeline's KV caches); a broadcast view or two
    variables over the same bytes are copied as without it. Results match slot_by_slot either way."""
    import torch
    buf = torch.zeros(2, 1)
    g = _two_states(buf[0], buf[1])
    e, ref = sp.Engine(g, mode="emulated_replay", adopt_variables=True), ref_engine(g)
    assert e.variables["a"] is g.values["a"].data and e.variables["b"] is g.values["b"].data
    for i in range(4):
        x = rand(5, seed=i)
        assert np.array_equal(e.run({"x": x})[g.outputs[0].name], ref.run({"x": x})[g.outputs[0].name])
    assert torch.equal(buf.reshape(-1), torch.cat([ref.variables["a"], ref.variables["b"]]))   # state in buf
    assert not torch.equal(buf, torch.zeros(2, 1))
    same = torch.zeros(1)
    shared = sp.Engine(_two_states(same, same), mode="emulated_replay", adopt_variables=True)
    assert shared.variables["a"] is not same and shared.variables["b"] is not same
    wide = _two_states(torch.zeros(()).expand(2), torch.zeros(1))
    w = sp.Engine(wide, mode="emulated_replay", adopt_variables=True)
    assert w.variables["a"] is not wide.values["a"].data and w.variables["b"] is wide.values["b"].data
    plain = sp.Engine(g, mode="emulated_replay")
    assert plain.variables["a"] is not g.values["a"].data                    # the default copies


def test_plan_keys_are_named():
    """A runner's key names its parts (PlanKey): outputs, shape signature, mode, device, calling thread."""
    import threading

    from shapeplan.runtime.runner import PlanKey
    e = sp.Engine(mlp(), mode="emulated_replay")
    e.run({"x": rand(3, 8)})
    (r,) = e.runners()
    assert isinstance(r.key, PlanKey) and r.key.signature == ((3, 8),)
    assert (r.key.mode, r.key.device, r.key.thread) == ("emulated_replay", "cpu", threading.get_ident())
