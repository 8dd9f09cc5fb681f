"""Helpers for optimizer tests: build, optimize, compare numerically with the unoptimized graph."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapeplan as sp
from shapeplan.ops.registry import is_supported


def need(*ops: str, domain: str = "") -> None:
    missing = [o for o in ops if not is_supported(o, domain)]
    if missing:
        pytest.skip(f"ops not in the op table yet: {missing}")


def ops_of(g: sp.Graph) -> list[str]:
    return [n.op_type for n in g.nodes]


def run_pass(g: sp.Graph, fn: Any) -> tuple[sp.Graph, int]:
    g2 = g.copy()
    n = fn(g2)
    g2.verify()
    return g2, n


def feeds_for(g: sp.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in g.inputs:
        shape = tuple(d if isinstance(d, int) else 2 for d in v.shape)  # type: ignore[union-attr]
        if v.dtype.is_float:
            out[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy)
        elif v.dtype.name == "bool":
            out[v.name] = rng.random(shape) > 0.5
        else:
            out[v.name] = rng.integers(-5, 6, shape).astype(v.dtype.numpy)
    return out


def assert_same(g: sp.Graph, g2: sp.Graph | None = None, rtol: float = 1e-5, atol: float = 1e-5,
                seed: int = 0) -> None:
    """g2 (default: sp.optimize(g)) computes what g computes."""
    feeds = feeds_for(g, seed)
    want = sp.compile(g, optimize=False).run(feeds)
    got = sp.compile(g2 if g2 is not None else g, optimize=g2 is None).run(feeds)
    assert list(want) == list(got)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k], dtype=np.float64), np.asarray(want[k], dtype=np.float64),
                                   rtol=rtol, atol=atol, err_msg=k)
