"""Graph IR and builder API."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan.ir.graph import ValueKind


def test_builder_infers_symbolic_shapes() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 4))
    y = g.op.Relu(g.op.Add(x, np.ones(4, np.float32)))
    assert y.dtype.name == "float32"
    assert y.shape == ("batch", 4)
    g.set_outputs(y)
    g.verify()
    assert [n.op_type for n in g.nodes] == ["Add", "Relu"]


def test_value_kinds() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    c = g.constant(np.zeros(2, np.float32), name="c")
    v = g.variable("state", torch.zeros(2))
    assert (x.kind, c.kind, v.kind) == (ValueKind.PLACEHOLDER, ValueKind.CONSTANT, ValueKind.VARIABLE)
    assert g.constants == [c] and g.variables == [v]


def test_all_dtypes_resolve() -> None:
    for name in ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                 "uint8", "uint16", "uint32", "uint64", "bool"]:
        d = sp.dtype(name)
        assert d.name == name
        assert sp.dtype(d.onnx) is d
        if d.torch is not None:
            assert sp.dtype(d.torch) is d
    with pytest.raises(ValueError, match="unknown dtype"):
        sp.dtype("float13")


def test_unknown_op_lists_near_matches() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    with pytest.raises(sp.UnsupportedOpError, match="Relu"):
        g.op.Rellu(x)


def test_toposort_and_cycle_detection() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    a = g.op.Relu(x)
    b = g.op.Neg(a)
    g.set_outputs(b)
    g.nodes.reverse()
    with pytest.raises(sp.ModelError, match="defined later"):
        g.verify()
    g.toposort()
    g.verify()
    # make a cycle: Relu reads Neg's output
    g.nodes[0].inputs[0] = b
    with pytest.raises(sp.ModelError, match="cycle"):
        g.toposort()


def test_copy_is_deep_structurally() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    g.set_outputs(g.op.Relu(x))
    h = g.copy()
    h.nodes[0].op_type = "Neg"
    assert g.nodes[0].op_type == "Relu"
    assert h.nodes[0].inputs[0] is h.inputs[0]
    assert h.outputs[0].producer is h.nodes[0]


def test_slot_plan_releases_registers() -> None:
    from shapeplan.plan.compiler import compile_plan

    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    a = g.op.Relu(x)
    b = g.op.Neg(a)
    c = g.op.Abs(b)
    g.set_outputs(c)
    plan = compile_plan(g)
    assert [s.op_type for s in plan.slots] == ["Relu", "Neg", "Abs"]
    # a is released after Neg, b after Abs; inputs and outputs are pinned
    rel = plan.release_at_step()
    assert rel[plan.slots[0].outs[0]] == 1 and rel[plan.slots[1].outs[0]] == 2
    assert plan.slots[2].outs[0] not in rel


def test_numpy_in_numpy_out_torch_in_torch_out() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (3,))
    g.set_outputs(g.op.Relu(x))
    e = sp.compile(g, mode="slot_by_slot")
    out_np = e.run({"x": np.array([-1, 0, 2], np.float32)})
    assert isinstance(next(iter(out_np.values())), np.ndarray)
    out_t = e.run({"x": torch.tensor([-1.0, 0.0, 2.0])})
    y = next(iter(out_t.values()))
    assert isinstance(y, torch.Tensor) and y.tolist() == [0.0, 0.0, 2.0]


def test_builder_takes_numpy_tensor_attributes() -> None:
    """A tensor attribute given as a numpy array (ConstantOfShape's ``value``) becomes a torch tensor, as
    the ONNX importer makes it: it used to reach the kernel as numpy and fail there."""
    g = sp.Graph()
    x = g.placeholder("x", "float32", (3,))
    c = g.op.ConstantOfShape(np.array([3], np.int64), value=np.array([0.5], np.float32))
    g.set_outputs(g.op.Add(x, c))
    assert isinstance(g.nodes[0].attrs["value"], torch.Tensor)
    out = sp.compile(g, optimize=False).run({"x": np.ones(3, np.float32)})
    np.testing.assert_array_equal(next(iter(out.values())), np.full(3, 1.5, np.float32))
