"""On CUDA: host-read inputs never sync inside a capture, and mode auto resolves per segment
triton -> cuda_graphs -> slot_by_slot. Skipped without CUDA."""
from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import shapeplan as sp  # noqa: E402
from shapeplan.ops.registry import is_supported  # noqa: E402
from shapeplan.optimize import optimize  # noqa: E402
from shapeplan.plan.compiler import host_read_registers  # noqa: E402

needs_matmul = pytest.mark.skipif(not is_supported("MatMul"), reason="op table has no MatMul")


def _qkv_graph(dtype: str = "float32") -> sp.Graph:
    rng = np.random.default_rng(0)
    g = sp.Graph()
    x = g.placeholder("x", dtype, (2, 3, 64))
    q = g.op.MatMul(x, (rng.standard_normal((64, 64)) / 8).astype(dtype))
    k = g.op.MatMul(x, (rng.standard_normal((64, 32)) / 8).astype(dtype))
    v = g.op.MatMul(x, (rng.standard_normal((64, 32)) / 8).astype(dtype))
    g.set_outputs(g.op.Add(g.op.Sigmoid(q), g.op.Concat(k, v, axis=-1)))
    return g


def _out(eng, x):
    return eng.run({"x": x})[eng.output_names[0]]


@needs_matmul
@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
def test_horizontal_fusion_split_captures(mode):
    opt = optimize(_qkv_graph())
    assert any(n.op_type == "Split" for n in opt.nodes)
    ref = sp.compile(opt, device="cuda", mode="slot_by_slot", optimize=False)
    eng = sp.compile(opt, device="cuda", mode=mode, optimize=False)    # explicit mode: capture errors raise
    for _ in range(6):
        x = torch.randn(2, 3, 64, device="cuda")
        a, b = _out(ref, x), _out(eng, x)
        if mode == "cuda_graphs":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    info = eng.inspect()
    assert info.phase == "REPLAYING"
    assert all(s["state"] == "REPLAYING" for s in info.segments if s["capturable"])


def test_plan_constant_reshape_shape_is_read_on_the_host():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (4, 6))
    s = g.op.Shape(x)
    first = g.op.Slice(s, np.array([0], "int64"), np.array([1], "int64"))
    y = g.op.Reshape(g.op.Relu(x), g.op.Concat(first, np.array([3, 2], "int64"), axis=0))
    g.set_outputs(g.op.Add(g.op.Unsqueeze(y, np.array([0], "int64")), np.float32(1.0)))
    ref = sp.compile(g, device="cuda", mode="slot_by_slot", optimize=False)
    eng = sp.compile(g, device="cuda", mode="cuda_graphs", optimize=False)
    for _ in range(6):
        x = torch.randn(4, 6, device="cuda")
        assert torch.equal(_out(ref, x), _out(eng, x))
    runner = eng.runners()[0]
    assert eng.inspect().phase == "REPLAYING"
    hosts = [r for r in host_read_registers(runner.plan) if r in runner.const_values]
    assert hosts and all(runner.const_values[r].device.type == "cpu" for r in hosts)


@needs_matmul
def test_auto_resolves_triton_then_cuda_graphs_then_slot_by_slot_per_segment():
    rng = np.random.default_rng(1)
    g = sp.Graph()
    x = g.placeholder("x", "float16", (4, 64))
    shp = g.placeholder("shape", "int64", (2,))
    t = g.op.Add(x, rng.standard_normal(64).astype("float16"))
    t = g.op.Mul(t, g.op.Sigmoid(t))
    y = g.op.RMSNormalization(t, np.ones(64, "float16"), _domain="shapeplan", epsilon=1e-5)   # seg: triton
    nz1 = g.op.NonZero(g.op.Greater(x, np.array(9.0, "float16")))                            # gap
    z = g.op.MatMul(y, (rng.standard_normal((64, 64)) / 8).astype("float16"))                # seg: graph only
    nz2 = g.op.NonZero(g.op.Greater(z, np.array(9.0, "float16")))                            # gap
    w = g.op.Reshape(z, shp)            # seg: reads a runtime device tensor on the host -> capture fails
    g.set_outputs(w, nz1, nz2)
    ref = sp.compile(g, device="cpu", mode="slot_by_slot", optimize=False)
    eng = sp.compile(g, device="cuda", mode="auto", optimize=False)
    assert eng.exec_mode.value == "triton"
    for _ in range(7):
        xv = rng.standard_normal((4, 64)).astype("float16")
        feeds = {"x": xv, "shape": np.array([8, 32], "int64")}
        a, b = ref.run(feeds), eng.run(feeds)
        np.testing.assert_allclose(b[eng.output_names[0]].astype("float32"),
                                   a[ref.output_names[0]].astype("float32"), atol=3e-2, rtol=3e-2)
    segs = [s for s in eng.inspect().segments if s["capturable"]]
    by_op = {("RMSNormalization" in s["ops"], "Reshape" in s["ops"]): s for s in segs}
    tri, plain, failed = by_op[(True, False)], by_op[(False, False)], by_op[(False, True)]
    assert tri["state"] == "REPLAYING" and tri["capture"]["fused_steps"] >= 1          # triton
    assert plain["state"] == "REPLAYING" and plain["capture"]["fused_steps"] == 0      # plain CUDA graph
    assert failed["state"] == "FAILED" and failed["eager_runs"] >= 1                   # slot by slot
    assert eng.inspect().phase == "REPLAYING"
