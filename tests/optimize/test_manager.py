import numpy as np
import pytest

import shapeplan as sp
from shapeplan.optimize import PASS_NAMES, optimize, optimize_with_report

from tests.optimize.util import assert_same


def _g() -> sp.Graph:
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2, 3))
    y = g.op.Neg(g.op.Neg(g.op.Add(x, np.zeros((2, 3), np.float32))))
    g.set_outputs(g.op.Relu(y))
    return g


def test_does_not_mutate_input_and_reports():
    g = _g()
    before = g.to_text()
    g2, rep = optimize_with_report(g)
    assert g.to_text() == before
    assert [n.op_type for n in g2.nodes] == ["Relu"]
    assert rep.nodes_before == 4 and rep.nodes_after == 1
    assert rep.applied("Peephole") == 1 and rep.applied("AlgebraicIdentities") == 1
    d = rep.to_dict()
    assert [p["name"] for p in d["passes"]] == PASS_NAMES
    assert "Peephole" in rep.to_text()
    assert g2.outputs[0].name == g.outputs[0].name
    assert_same(g, g2)


def test_skip_and_env(monkeypatch):
    g = _g()
    assert "Neg" in [n.op_type for n in optimize(g, skip=["Peephole"]).nodes]
    monkeypatch.setenv("SHAPEPLAN_OPTIMIZER_SKIP", "Peephole,AlgebraicIdentities")
    assert len(optimize(g).nodes) == 4
    monkeypatch.delenv("SHAPEPLAN_OPTIMIZER_SKIP")
    monkeypatch.setenv("SHAPEPLAN_OPTIMIZER", "0")
    g2, rep = optimize_with_report(g)
    assert len(g2.nodes) == 4 and rep.disabled
    with pytest.raises(ValueError, match="unknown optimizer pass"):
        optimize(g, skip=["NoSuchPass"])


def test_log_and_verify_env(monkeypatch, caplog):
    monkeypatch.setenv("SHAPEPLAN_OPTIMIZER_LOG", "1")
    monkeypatch.setenv("SHAPEPLAN_VERIFY", "1")
    with caplog.at_level("INFO", logger="shapeplan.optimize"):
        optimize(_g())
    assert any("Peephole" in r.getMessage() for r in caplog.records)


def test_diagnostics_fusion_events(monkeypatch):
    diag = pytest.importorskip("shapeplan.diagnostics")
    if not hasattr(diag, "record"):
        pytest.skip("no diagnostics.record")
    got = []
    monkeypatch.setattr(diag, "record", lambda cat, msg, **kw: got.append((str(cat), msg)))
    optimize(_g())
    assert any("Peephole" in m for _, m in got)
    assert all("FUSION" in c for c, _ in got)


def test_graph_output_name_kept_when_output_is_input():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (3,))
    g.set_outputs(g.op.Identity(g.op.Neg(g.op.Neg(x))))
    g2 = optimize(g)
    assert g2.outputs[0].name == g.outputs[0].name
    assert [n.op_type for n in g2.nodes] == ["Identity"]
    assert_same(g, g2)
