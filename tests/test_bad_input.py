"""Bad feeds raise sp.InputError naming the input, what was expected and what was given; the engine
keeps working for the next valid call."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import shapeplan as sp


@pytest.fixture()
def engine() -> sp.Engine:
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 3))
    g.set_outputs(g.op.Relu(x))
    return sp.compile(g, mode="slot_by_slot")


def _ok(engine: sp.Engine) -> None:
    out = engine.run({"x": np.array([[-1, 2, 3]], np.float32)})
    assert next(iter(out.values())).tolist() == [[0, 2, 3]]


@pytest.mark.parametrize("feeds, pattern", [
    ({}, r"missing input\(s\) \['x'\].*expects \(x: float32\['batch', 3\]\)"),
    ({"x": np.zeros((1, 3), np.float32), "y": np.zeros(1)}, r"unknown input\(s\) \['y'\]"),
    ({"x": np.zeros((1, 3), np.float64)}, r"input 'x': expected dtype float32, got float64"),
    ({"x": torch.zeros((1, 3), dtype=torch.int64)}, r"input 'x': expected dtype float32, got int64"),
    ({"x": np.zeros((1, 4), np.float32)}, r"input 'x': dimension 1 must be 3.*got shape \[1, 4\]"),
    ({"x": np.zeros((3,), np.float32)}, r"input 'x': expected rank 2.*got shape \[3\]"),
])
def test_bad_feeds(engine: sp.Engine, feeds, pattern) -> None:
    with pytest.raises(sp.InputError, match=pattern):
        engine.run(feeds)
    _ok(engine)


def test_feeds_must_be_a_mapping(engine: sp.Engine) -> None:
    with pytest.raises(sp.InputError, match="dict"):
        engine.run([np.zeros((1, 3), np.float32)])  # type: ignore[arg-type]
    _ok(engine)


def test_kernel_failure_names_the_node() -> None:
    g = sp.Graph()
    a = g.placeholder("a", "float32", (None, None))
    b = g.placeholder("b", "float32", (None, None))
    g.set_outputs(g.op.Add(a, b, _name="the_add"))
    e = sp.compile(g, mode="slot_by_slot")
    with pytest.raises(sp.ExecutionError, match=r"the_add.*a: float32\[2, 3\].*b: float32\[4, 5\]"):
        e.run({"a": np.zeros((2, 3), np.float32), "b": np.zeros((4, 5), np.float32)})
    out = e.run({"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)})
    assert next(iter(out.values())).sum() == 12
