"""Frozen-plan records (runtime/frozen_records.py): a warm start freezes from disk and captures on its
first call, with the results every other path gives; a record that does not fit is ignored."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import shapeplan as sp
from shapeplan import diagnostics
from tests.runtime.graphs import mlp, rand, ref_engine, transformer_stack, with_gap


@pytest.fixture(autouse=True)
def records_on(tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SHAPEPLAN_FROZEN_RECORDS", "1")


def _phases(e: sp.Engine, g: sp.Graph, feeds: list[dict], ref: sp.Engine) -> list[str]:
    out = []
    for f in feeds:
        got = e.run(f)
        want = ref.run(f)
        for name in want:
            assert np.array_equal(got[name], want[name]), name
        out.append(e.inspect().phase)
    return out


def _records(tmp_path) -> list[str]:
    d = tmp_path / "frozen"
    return sorted(os.listdir(d)) if d.is_dir() else []


@pytest.mark.parametrize("build", [mlp, transformer_stack, with_gap])
def test_a_second_engine_captures_on_its_first_call(tmp_path, build):
    g = build()
    shape = (4, 8) if build is mlp else (8, 16) if build is transformer_stack else (5, 4)
    feeds = [{"x": rand(*shape, seed=i)} for i in range(4)]
    ref = ref_engine(g)
    first = _phases(sp.Engine(g, mode="emulated_replay"), g, feeds, ref)
    assert first[:2] == ["SHAPES_FROZEN", "SHAPES_FROZEN"]          # record, warm up, then capture
    assert len(_records(tmp_path)) == 1
    diagnostics.enable(["LIFECYCLE", "SEGMENT", "CACHE"], level="detailed")
    try:
        e = sp.Engine(g, mode="emulated_replay")
        again = _phases(e, g, feeds, ref)
        msgs = [ev.message for ev in diagnostics.events()]
    finally:
        diagnostics.disable()
    captured = [s for s in e.inspect().segments if s.get("state") == "REPLAYING"]
    assert again[0] == "REPLAYING" and set(again) == {"REPLAYING"}, again   # captured on call 1
    assert captured and "shapes frozen from a frozen-plan record" in msgs
    assert _records(tmp_path) == _records(tmp_path)                  # nothing rewritten


def test_another_shape_or_mode_has_no_record(tmp_path):
    g = mlp()
    ref = ref_engine(g)
    _phases(sp.Engine(g, mode="emulated_replay"), g, [{"x": rand(4, 8, seed=i)} for i in range(3)], ref)
    other = _phases(sp.Engine(g, mode="emulated_replay"), g, [{"x": rand(3, 8, seed=i)} for i in range(3)], ref)
    assert other[0] == "SHAPES_FROZEN"                                # a new signature records as usual
    assert len(_records(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["garbage", "wrong_version", "missing_register", "bad_dtype"])
def test_a_damaged_record_is_ignored(tmp_path, damage):
    g = with_gap()
    feeds = [{"x": rand(5, 4, seed=i)} for i in range(4)]
    ref = ref_engine(g)
    _phases(sp.Engine(g, mode="emulated_replay"), g, feeds, ref)
    (name,) = _records(tmp_path)
    path = tmp_path / "frozen" / name
    rec = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "wrong_version":
        path.write_text(json.dumps(dict(rec, version=-1)))
    elif damage == "missing_register":
        rec["meta"] = {}                                             # Shape's input has no layout
        path.write_text(json.dumps(rec))
    else:
        first = next(iter(rec["meta"]))
        rec["meta"][first][2] = "no_such_dtype"
        path.write_text(json.dumps(rec))
    phases = _phases(sp.Engine(g, mode="emulated_replay"), g, feeds, ref)
    assert phases[0] == "SHAPES_FROZEN" and phases[-1] == "REPLAYING"   # the usual three calls


def test_records_are_off_on_the_cpu_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("SHAPEPLAN_FROZEN_RECORDS")
    g = mlp()
    _phases(sp.Engine(g, mode="emulated_replay"), g, [{"x": rand(4, 8, seed=i)} for i in range(3)], ref_engine(g))
    assert _records(tmp_path) == []


def test_the_triton_backend_writes_and_takes_back_its_layouts():
    """What the triton backend's warm-up recorded goes into the record as JSON-able lists and comes back
    as the same layouts (shape, strides, dtype, 16-byte alignment); no layouts: it must warm up."""
    import types

    import torch

    from shapeplan.runtime.backends.triton.backend import TritonBackend
    from shapeplan.runtime.backends.triton.codegen import Meta
    b = TritonBackend()
    seg = types.SimpleNamespace(plan_key="p1", plan=object(), segment=types.SimpleNamespace(index=0),
                                device=torch.device("cuda"))
    metas = {3: Meta((1, 8, 64), (512, 64, 1), torch.bfloat16, 0), 7: Meta((4,), (2,), torch.float32, 8)}
    b._used[b._key(seg)] = dict(metas)
    lay = b.layouts(seg)
    assert json.loads(json.dumps(lay)) == lay
    assert b.layouts(seg) is None                    # handed over once
    assert b.seed(seg, lay) is True and b._metas[b._key(seg)] == metas
    assert b.seed(seg, None) is False and b.seed(seg, {}) is False
    with pytest.raises(ValueError):
        b.seed(seg, {"3": [[1], [1], "not_a_dtype_name_but_an_attr", 0]})


def test_prepare_freezes_from_the_record_before_the_first_call(tmp_path):
    """``Engine.prepare`` does what a first call's record lookup does, without running: the first run
    then captures, with the results every other path gives; without a record, or once a plan has run,
    it changes nothing."""
    g = transformer_stack()
    feeds = [{"x": rand(8, 16, seed=i)} for i in range(3)]
    ref = ref_engine(g)
    fresh = sp.Engine(g, mode="emulated_replay")
    assert fresh.prepare(feeds[0]) is False                          # no record yet
    assert fresh.runners() == []                                     # nothing kept
    _phases(fresh, g, feeds, ref)
    assert fresh.prepare(feeds[0]) is False                          # that plan has run
    e = sp.Engine(g, mode="emulated_replay")
    assert e.prepare({"x": np.zeros((8, 16), np.float32)}) is True   # values do not matter
    assert e.inspect().phase == "SHAPES_FROZEN"
    assert e.prepare(feeds[0]) is False                              # once
    assert _phases(e, g, feeds, ref) == ["REPLAYING"] * 3
    m = sp.Engine(mlp(), mode="emulated_replay")
    assert m.prepare({"x": np.zeros((3, 8), np.float32)}) is False   # a shape with no record
    assert m.runners() == []
    with pytest.raises(sp.InputError):
        e.prepare({"y": np.zeros((8, 16), np.float32)})            # feeds are checked as run's are
    assert _phases(e, g, feeds[:1], ref) == ["REPLAYING"]           # still usable
