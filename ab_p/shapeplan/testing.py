"""Assertions for tests of code built on shapeplan. On failure they dump the plan state
(``engine.inspect()``: phase, segments with states and failure reasons, diagnostics counters)."""
from __future__ import annotations

import json
from typing import Any


def _dump(engine: Any) -> str:
    info = engine.inspect()
    from shapeplan import diagnostics
    state = {"phase": info.phase, "captures": info.capture_count, "replays": info.replay_count,
             "segments": [{k: s.get(k) for k in ("index", "state", "ops", "reason", "failure", "captures",
                                                  "replays", "drifts")} for s in info.segments],
             "plans": info.plans(), "diagnostics_counters": diagnostics.counters(),
             "segment_records": diagnostics.segment_records()[-20:]}
    return json.dumps(state, indent=1, default=str)


def assert_phase_reached(engine: Any, phase: str) -> None:
    order = ["SLOT_BY_SLOT", "SHAPES_FROZEN", "REPLAYING"]
    got = engine.inspect().phase
    want = str(getattr(phase, "value", phase)).upper()
    ok = got == want or (want in order and got in order and order.index(got) >= order.index(want)) \
        or (want == "SHAPES_FROZEN" and got == "REPLAY_BLOCKED")
    if not ok:
        raise AssertionError(f"expected phase {want} (or later), plan is in {got}\n{_dump(engine)}")


def assert_fully_replaying(engine: Any) -> None:
    info = engine.inspect()
    bad = [s for s in info.segments if s.get("capturable") and s.get("state") != "REPLAYING"]
    if info.phase != "REPLAYING" or bad:
        raise AssertionError(f"plan is not fully replaying (phase {info.phase}; segments not replaying: "
                             f"{[s['index'] for s in bad]})\n{_dump(engine)}")


def assert_no_address_drift(engine: Any) -> None:
    runner = engine.inspect().runner
    drift = runner.address_drift() if runner is not None else []
    drifted = [s for s in (runner.segments if runner else []) if s.drifts]
    if drift or drifted:
        raise AssertionError(f"address drift: {drift} {[s.ctx.segment.index for s in drifted]}\n{_dump(engine)}")


def assert_no_capture_failures(engine: Any) -> None:
    failed = [s for s in engine.inspect().segments if s.get("state") == "FAILED"]
    if failed:
        raise AssertionError(f"segments failed to capture: "
                             f"{[(s['index'], s.get('failure')) for s in failed]}\n{_dump(engine)}")


def assert_matches_slot_by_slot(engine: Any, feeds: dict[str, Any], calls: int = 6) -> None:
    """Run ``feeds`` ``calls`` times through ``engine`` and once through a slot_by_slot engine of the
    same graph; every output must be bit-identical."""
    import numpy as np

    from shapeplan.runtime.engine import Engine
    ref = Engine(engine.graph, device=engine.device, mode="slot_by_slot").run(feeds)
    for i in range(calls):
        got = engine.run(feeds)
        for k, want in ref.items():
            g = np.asarray(got[k].cpu() if hasattr(got[k], "cpu") else got[k])
            w = np.asarray(want.cpu() if hasattr(want, "cpu") else want)
            if g.shape != w.shape or not np.array_equal(g, w, equal_nan=w.dtype.kind in "fc"):
                raise AssertionError(f"call {i + 1}: output {k!r} differs from slot_by_slot\n{_dump(engine)}")


__all__ = ["assert_fully_replaying", "assert_matches_slot_by_slot", "assert_no_address_drift",
           "assert_no_capture_failures", "assert_phase_reached"]
