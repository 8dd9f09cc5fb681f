from __future__ import annotations

import pytest

import shapeplan as sp
from shapeplan.errors import CacheError
from shapeplan.plan.compiler import compile_plan
from shapeplan.plan.serialize import deserialize_plan, serialize_plan
from tests.runtime.graphs import rand, transformer_stack, with_gap, with_state


def test_segments_boundaries_and_constant_slots():
    p = compile_plan(with_gap())
    shape_slot = [s.index for s in p.slots if s.op_type == "Shape"]
    assert set(shape_slot) <= p.const_slots
    kinds = [(seg.capturable, [p.slots[i].op_type for i in seg.slot_ids]) for seg in p.segments]
    assert kinds[1] == (False, ["NonZero"]) and kinds[0][0] and kinds[2][0]
    assert "dynamic_output_size" in p.segments[1].reason
    assert p.segments[1].live_out and p.segments[2].live_in


def test_buffer_reuse_on_12_layer_stack_drops_10x():
    g = transformer_stack(12)
    e = sp.Engine(g, mode="emulated_replay")
    e.run({"x": rand(8, 16)})
    b = e.inspect().buffers()["all_intermediates"]
    assert b["intermediates"] >= 10 * b["buffers"], b


def test_serialize_round_trip_runs_identically():
    import numpy as np
    for g in (transformer_stack(2), with_gap(), with_state()):
        p = compile_plan(g)
        q = deserialize_plan(serialize_plan(p))
        assert q.summary() == p.summary() and [s.op_type for s in q.slots] == [s.op_type for s in p.slots]
        assert q.segments[0].live_out == p.segments[0].live_out
    g = transformer_stack(2)
    q = deserialize_plan(serialize_plan(compile_plan(g)))
    x = rand(8, 16)
    a = sp.Engine(g, mode="slot_by_slot").run({"x": x})
    b = sp.Engine(q.graph, mode="slot_by_slot").run({"x": x})
    assert np.array_equal(list(a.values())[0], list(b.values())[0])


def test_serialized_plan_detects_damage():
    data = bytearray(serialize_plan(compile_plan(with_gap())))
    data[100] ^= 1
    with pytest.raises(CacheError, match="hash"):
        deserialize_plan(bytes(data))


def test_dot_export():
    dot = compile_plan(with_gap()).to_dot()
    assert dot.startswith("digraph") and "NonZero" in dot and "cluster_2" in dot and "(const)" in dot
