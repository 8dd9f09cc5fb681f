"""emulated_replay's captured program: out= steps into pooled buffers, alias-safe buffer sharing,
bit-identical to slot_by_slot; the constant guard on the replay path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan import testing
from tests.runtime.graphs import mlp, op, rand, ref_engine


def small_ops(n: int) -> sp.Graph:
    g = sp.Graph("small_ops")
    o = op(g)
    h = g.placeholder("x", "float32", (4, 16))
    for i in range(n):
        k = i % 4
        if k == 0:
            h = o.Add(h, g.constant(rand(16, seed=i), name=f"c{i}"))
        elif k == 1:
            h = o.Tanh(h)
        elif k == 2:
            h = o.Mul(h, g.constant(np.float32(1.01), name=f"c{i}"))
        else:
            h = o.Relu(h)
    g.set_outputs(h)
    return g


def views_outlive_their_base() -> sp.Graph:
    """A view (Transpose) of an early result is read after many later results were written: the
    early result's buffer must not be handed to them."""
    g = sp.Graph("views")
    o = g.op                                                  # the ONNX op table (Identity, Transpose)
    x = g.placeholder("x", "float32", (4, 4))
    a = o.Add(x, g.constant(rand(4, seed=1), name="c"))
    t = o.Transpose(a)
    r = o.Reshape(a, g.constant(np.array([16], np.int64), name="flat"))
    h, k = x, g.constant(np.float32(1.5), name="k")
    for _ in range(6):
        h = o.Tanh(o.Mul(h, k))
    y = o.Add(o.Identity(t), h)
    g.set_outputs(y, o.Relu(r))
    return g


def _program(e: sp.Engine):
    return [s.handle.program for s in e.inspect().runner.segments if s.handle is not None]


@pytest.mark.parametrize("make,shape", [(lambda: small_ops(40), (4, 16)), (views_outlive_their_base, (4, 4)),
                                        (mlp, (3, 8))])
def test_program_matches_slot_by_slot_over_many_calls(make, shape):
    g = make()
    e, ref = sp.Engine(g, mode="emulated_replay"), ref_engine(g)
    for i in range(12):
        x = rand(*shape, seed=i)
        a, b = e.run({"x": x}), ref.run({"x": x})
        for k in b:
            assert np.array_equal(a[k], b[k]), (i, k)
    testing.assert_fully_replaying(e)
    testing.assert_no_address_drift(e)
    assert all(p is not None and p.counts.get("out", 0) > 0 for p in _program(e))


def test_out_steps_write_preallocated_buffers_in_place():
    g = small_ops(40)
    e = sp.Engine(g, mode="emulated_replay")
    for i in range(5):
        e.run({"x": rand(4, 16, seed=i)})
    (prog,) = _program(e)
    assert prog.counts.get("kernel", 0) == 0 and prog.counts["out"] >= 30     # Relu has no out=: a call
    bufs = [(id(b), b.data_ptr()) for b in prog.fn.__closure__ if isinstance(b.cell_contents, torch.Tensor)
            for b in [b.cell_contents]]
    e.run({"x": rand(4, 16, seed=9)})
    assert bufs == [(id(b), b.data_ptr()) for b in prog.fn.__closure__
                    if isinstance(b.cell_contents, torch.Tensor) for b in [b.cell_contents]]
    assert prog.pool_bytes <= 4 * 4 * 16 * 4       # 40 intermediates share a few [4, 16] buffers


def test_views_keep_their_base_buffer_alive():
    g = views_outlive_their_base()
    e = sp.Engine(g, mode="emulated_replay")
    for i in range(5):
        e.run({"x": rand(4, 4, seed=i)})
    (prog,) = _program(e)
    assert prog.counts.get("alias", 0) == 1                  # Identity costs nothing
    x = rand(4, 4, seed=77)
    got, want = e.run({"x": x}), ref_engine(g).run({"x": x})
    for k in want:
        assert np.array_equal(got[k], want[k]), k


def test_weight_edited_in_place_is_rejected():
    g = mlp()
    e = sp.Engine(g, mode="emulated_replay")
    for i in range(5):
        e.run({"x": rand(2, 8, seed=i)})
    w = g.values["b1"].data
    with torch.no_grad():
        w.add_(1.0)
    with pytest.raises(sp.LifecycleError, match="b1.*modified in place"):
        e.run({"x": rand(2, 8)})


@pytest.mark.parametrize("name,edit", [("c396", "inplace"), ("c0", "replace")])
def test_guard_on_many_constants_catches_edits_within_one_round(name, edit):
    g = small_ops(400)                                        # 200 constants
    e = sp.Engine(g, mode="emulated_replay", weight_guard="sampled")
    for i in range(5):
        e.run({"x": rand(4, 16, seed=i)})
    rounds = -(-len(g.constants) // e.GUARD_CHUNK)           # a steady replay checks one chunk per call
    v = g.values[name]
    if edit == "inplace":
        v.data.mul_(2)
    else:
        v.data = v.data.clone()
    with pytest.raises(sp.LifecycleError, match=name):
        for _ in range(rounds):
            e.run({"x": rand(4, 16)})


def test_inputs_that_require_grad_replay_like_slot_by_slot():
    g = small_ops(20)
    e, ref = sp.Engine(g, mode="emulated_replay"), sp.Engine(g, mode="slot_by_slot")
    out = g.outputs[0].name
    for i in range(7):
        x = torch.from_numpy(rand(4, 16, seed=i)).requires_grad_()
        assert torch.equal(e.run({"x": x})[out].detach(), ref.run({"x": x})[out].detach())
    testing.assert_fully_replaying(e)


@pytest.mark.parametrize("edit", ["inplace", "replace"])
def test_default_guard_rejects_an_edited_weight_on_the_next_call(edit):
    g = small_ops(400)                                        # 200 constants: more than one chunk
    e = sp.Engine(g, mode="emulated_replay")
    for i in range(6):
        e.run({"x": rand(4, 16, seed=i)})
    v = g.constants[-1]
    if edit == "inplace":
        v.data.mul_(2)
    else:
        v.data = v.data.clone()
    with pytest.raises(sp.LifecycleError, match=v.name):
        e.run({"x": rand(4, 16)})
    with pytest.raises(ValueError, match="weight_guard"):
        sp.Engine(g, weight_guard="never")
