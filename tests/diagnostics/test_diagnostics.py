from __future__ import annotations

import json

import shapeplan as sp
from shapeplan import diagnostics
from shapeplan.diagnostics.timing import profile
from tests.runtime.graphs import mlp, rand


def test_disabled_records_nothing():
    diagnostics.disable(); diagnostics.reset()
    diagnostics.record("SEGMENT", "x", a=1)
    assert diagnostics.events() == [] and diagnostics.counters() == {}


def test_category_and_level_filters(diag):
    diagnostics.enable("SEGMENT,CACHE", level="detailed")
    diagnostics.record("SEGMENT", "kept")
    diagnostics.record("COMPILE", "filtered by category")
    diagnostics.record("CACHE", "filtered by level", level="full")
    diagnostics.record("CACHE", "kept detailed", level="detailed")
    assert [e.message for e in diagnostics.events()] == ["kept", "kept detailed"]


def test_ring_buffer_wraps_counters_survive(diag):
    n = diagnostics.RING_SIZE + 1000
    for i in range(n):
        diagnostics.record("EXECUTE", "e", i=i)
    evs = diagnostics.events()
    assert len(evs) == diagnostics.RING_SIZE and evs[-1].fields["i"] == n - 1
    assert diagnostics.counters()["EXECUTE"] == n


def test_env_configuration_and_json_report_file(tmp_path):
    path = tmp_path / "diag.json"
    diagnostics.configure_from_env({"SHAPEPLAN_DIAGNOSTICS": "LIFECYCLE,SEGMENT",
                                    "SHAPEPLAN_DIAGNOSTICS_LEVEL": "full",
                                    "SHAPEPLAN_DIAGNOSTICS_FILE": str(path)})
    try:
        e = sp.Engine(mlp(), mode="emulated_replay")
        for i in range(5):
            e.run({"x": rand(2, 8, seed=i)})
        diagnostics.write_report(str(path))
        rep = json.loads(path.read_text())
        assert rep["counters"]["LIFECYCLE"] >= 2
        assert any(s["state"] == "REPLAYING" for s in rep["segments"])     # per-segment terminal records
        assert rep["config"]["level"] == "full"
    finally:
        diagnostics.disable(); diagnostics.reset()


def test_op_timing_chrome_trace(tmp_path):
    e = sp.Engine(mlp(), mode="emulated_replay")
    t = profile(e, {"x": rand(2, 8)})
    assert set(t.by_op()) == {"MatMul", "Add", "Tanh"}
    p = t.write_chrome_trace(str(tmp_path / "trace.json"))
    tr = json.loads(open(p).read())
    assert len(tr["traceEvents"]) == 9 and tr["traceEvents"][0]["ph"] == "X"
