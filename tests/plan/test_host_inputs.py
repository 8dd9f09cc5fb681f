"""Host-read inputs (``OpDef.host_inputs``): constants bound as CPU tensors at compile time,
plan-constant shapes kept on the host at freeze; results stay bit-exact with slot_by_slot."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan.ops.registry import lookup
from shapeplan.optimize import optimize
from shapeplan.plan.compiler import compile_plan, host_read_registers


@pytest.mark.parametrize("op,opset,pos", [
    ("Split", 13, (1,)), ("Split", 18, (1,)), ("Reshape", 14, (1,)), ("Slice", 13, (1, 2, 3, 4)),
    ("Unsqueeze", 13, (1,)), ("Squeeze", 13, (1,)), ("Expand", 13, (1,)), ("Tile", 13, (1,)),
    ("Pad", 18, (1, 2, 3)), ("Trilu", 14, (1,)), ("OneHot", 11, (1,)), ("TopK", 11, (1,)),
    ("ReduceSum", 13, (1,)), ("ReduceMean", 18, (1,)), ("ReduceMean", 13, ()), ("CumSum", 14, (1,))])
def test_registry_declares_host_inputs(op, opset, pos):
    assert lookup(op, "", opset).host_inputs == pos


def _qkv_graph() -> sp.Graph:
    rng = np.random.default_rng(0)
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2, 3, 16))
    q = g.op.MatMul(x, rng.standard_normal((16, 16)).astype("float32"))
    k = g.op.MatMul(x, rng.standard_normal((16, 8)).astype("float32"))
    v = g.op.MatMul(x, rng.standard_normal((16, 8)).astype("float32"))
    g.set_outputs(g.op.Add(q, g.op.Concat(k, v, axis=-1)))
    return g


def test_horizontal_fusion_split_binds_its_sizes_on_the_host():
    opt = optimize(_qkv_graph())
    splits = [n for n in opt.nodes if n.op_type == "Split"]
    assert splits, "HorizontalFusion should have fused the three MatMuls"
    plan = compile_plan(opt)
    slot = next(s for s in plan.slots if s.op_type == "Split")
    x = torch.randn(2, 3, 32)
    poison = torch.tensor([1, 1, 30])             # what a device register would hold: ignored
    a = slot.fn(x, poison)
    assert [t.shape[-1] for t in a] == [16, 8, 8]


@pytest.mark.parametrize("mode", ["emulated_replay", "auto"])
def test_optimized_qkv_matches_slot_by_slot_bit_exact(mode):
    g = _qkv_graph()
    opt = optimize(g)
    ref = sp.compile(g, mode="slot_by_slot")
    eng = sp.compile(opt, mode=mode)
    for _ in range(6):
        x = np.random.randn(2, 3, 16).astype("float32")
        a, b = ref.run({"x": x}), eng.run({"x": x})
        np.testing.assert_array_equal(a[ref.output_names[0]], b[eng.output_names[0]])
    assert eng.inspect().phase == "REPLAYING"


def _shape_reshape_graph() -> sp.Graph:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (4, 6))
    s = g.op.Shape(x)
    first = g.op.Slice(s, np.array([0], "int64"), np.array([1], "int64"))
    tgt = g.op.Concat(first, np.array([3, 2], "int64"), axis=0)
    y = g.op.Reshape(g.op.Relu(x), tgt)
    g.set_outputs(g.op.Add(y, np.float32(1.0)))
    return g


def test_plan_constant_shape_is_a_host_read_register():
    plan = compile_plan(_shape_reshape_graph())
    host = host_read_registers(plan)
    reshape = next(s for s in plan.slots if s.op_type == "Reshape")
    assert reshape.ins[1] in host and reshape.index not in plan.const_slots
    assert reshape.ins[0] not in host


def test_plan_constant_shape_stays_on_host_after_freeze_and_matches():
    g = _shape_reshape_graph()
    ref = sp.compile(g, mode="slot_by_slot")
    eng = sp.compile(g, mode="emulated_replay")
    for _ in range(5):
        x = np.random.randn(4, 6).astype("float32")
        np.testing.assert_array_equal(ref.run({"x": x})[ref.output_names[0]], eng.run({"x": x})[eng.output_names[0]])
    runner = eng.runners()[0]
    for r in host_read_registers(runner.plan):
        if r in runner.const_values:
            assert runner.const_values[r].device.type == "cpu"
    assert eng.inspect().phase == "REPLAYING"
