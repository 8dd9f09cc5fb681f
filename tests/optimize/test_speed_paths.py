"""The optimizer's fast paths give the same answers as the slow ones they short-cut.

* optimize() pauses the cyclic GC and restores the caller's setting (also when a pass raises);
* CSE's constant key (bytes via numpy) equals the dtype-view bytes for every dtype;
* the constant-predicate cache keyed on contents answers like the predicate itself;
* optimizing a repeated block gives one result for 1 and for many repeats (bench/optimizer_scale.py).
"""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan.errors import ModelError
from shapeplan.optimize import optimize_with_report
from shapeplan.optimize import cse
from shapeplan.optimize.manager import run_pipeline
from shapeplan.optimize.rewrite import all_equal, reset_sink
from shapeplan.optimize.rewrite.patterns import _safe_pred
from tests.optimize.util import need


def _small_graph() -> sp.Graph:
    g = sp.Graph("g")
    x = g.placeholder("x", "float32", (2, 3))
    g.set_outputs(g.op.Add(g.op.Relu(x), np.float32(0.0)))
    return g


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_setting_restored(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        optimize_with_report(_small_graph())
        assert gc.isenabled() is enabled

        def boom(graph: sp.Graph) -> int:
            raise ModelError("boom")

        with pytest.raises(ModelError):
            run_pipeline(_small_graph(), [("Boom", boom)])
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("t", [
    torch.randn(3, 4), torch.tensor(1.5), torch.arange(6).reshape(2, 3).t(), torch.tensor([True, False]),
    torch.randn(4, dtype=torch.float16), torch.randn(4).to(torch.bfloat16), torch.tensor([-0.0]),
    torch.randn(3, dtype=torch.complex64), torch.tensor([], dtype=torch.int8), torch.randn(3, requires_grad=True),
])
def test_cse_raw_bytes_match_dtype_view(t: torch.Tensor) -> None:
    want = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert cse._raw(t) == want


def test_pred_cache_by_contents() -> None:
    reset_sink()
    calls = []

    def one(t: torch.Tensor) -> bool:
        calls.append(t)
        return all_equal(t, 1)

    a, b = torch.tensor(1.0), torch.tensor(1.0)      # equal contents, different tensors
    c = torch.tensor(1.0, dtype=torch.float64)         # other dtype: its own entry
    assert _safe_pred(one, a) and _safe_pred(one, b) and _safe_pred(one, c)
    assert len(calls) == 2
    assert not _safe_pred(one, torch.tensor(2.0))
    assert _safe_pred(one, torch.ones(2, 2)) and not _safe_pred(one, torch.tensor([1.0, 0.0]))
    bf = torch.tensor([1.0]).to(torch.bfloat16)        # no numpy dtype: falls back to the predicate
    assert _safe_pred(one, bf)


def test_repeated_blocks_optimize_like_one_block() -> None:
    need("MatMul", "ReduceMean")
    from bench.optimizer_scale import build
    small, big = build(1), build(400)
    g1, r1 = optimize_with_report(small)
    g2, r2 = optimize_with_report(big)
    blocks = len(big.nodes) // len(small.nodes)
    assert len(big.nodes) == blocks * len(small.nodes)
    assert len(g2.nodes) == blocks * len(g1.nodes)
    assert sorted(g2.op_histogram().items()) == sorted((k, v * blocks) for k, v in g1.op_histogram().items())
