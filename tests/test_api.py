"""The public API names of DESIGN.md stay what they are."""
from __future__ import annotations

import numpy as np

import shapeplan as sp


def test_optimize_is_a_function_even_after_the_package_is_imported() -> None:
    import shapeplan.optimize  # noqa: F401  (binds the submodule name on the package)
    from shapeplan.commands.demo import build_demo_graph

    g = build_demo_graph(layers=1, hidden=16)
    opt = sp.optimize(g)
    assert isinstance(opt, sp.Graph)
    assert len(opt.nodes) < len(g.nodes)
    assert all(hasattr(n, k) for n in opt.nodes for k in ("op_type", "inputs", "outputs", "attrs"))


def test_compile_run_inspect_freeze() -> None:
    from shapeplan.commands.demo import build_demo_graph

    g = build_demo_graph(layers=2, hidden=16)
    x = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    ref = sp.compile(g, mode="slot_by_slot").run({"x": x})
    eng = sp.compile(g, mode="auto")
    for _ in range(5):
        out = eng.run({"x": x})
    assert str(eng.inspect().phase).endswith("REPLAYING")
    (k, want), = ref.items()
    np.testing.assert_array_equal(out[k], want)
    eng.freeze()
    info = eng.inspect()
    assert "phase" in info.report()
    assert "digraph" in info.to_dot()


def test_compile_builds_the_plan_of_the_outputs_asked_for() -> None:
    """``sp.compile(..., outputs=[...])`` compiles that output set's plan up front (the one the caller
    will run: the LLM pipeline's next_token/next_position) instead of the all-outputs plan; a name
    that is not an output is an error at compile time."""
    import pytest

    from shapeplan.errors import ModelError
    g = sp.Graph("two_outputs")
    x = g.placeholder("x", "float32", (2, 3))
    a, b = g.op.Relu(x), g.op.Neg(x)
    g.set_outputs(a, b)
    eng = sp.compile(g, mode="slot_by_slot", outputs=[a.name])
    assert list(eng._plans) == [(a.name,)]
    got = eng.run({"x": -np.ones((2, 3), np.float32)}, outputs=[a.name])
    assert list(got) == [a.name] and list(eng._plans) == [(a.name,)]      # the run reused it
    assert list(sp.compile(g, mode="slot_by_slot")._plans) == [None]
    with pytest.raises(ModelError, match="do not exist"):
        sp.compile(g, mode="slot_by_slot", outputs=["nope"])
