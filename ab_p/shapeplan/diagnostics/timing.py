"""Op timing: run a plan slot by slot with a timer around each slot; export a Chrome trace.

    tracker = OpTimer()
    tracker.run(plan, regs)                   # like run_slot_by_slot, timed
    tracker.write_chrome_trace("trace.json")  # open in chrome://tracing or ui.perfetto.dev
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from shapeplan.diagnostics.core import record


@dataclass(slots=True)
class OpTimer:
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)   # (node, op, start_s, dur_s)
    t0: float = field(default_factory=time.perf_counter)

    def run(self, plan: Any, regs: list[Any]) -> list[Any]:
        from shapeplan.runtime.backends.slot_by_slot import run_slot
        for slot in plan.slots:
            t = time.perf_counter()
            run_slot(slot, regs)
            dt = time.perf_counter() - t
            self.spans.append((slot.node.name, slot.op_type, t - self.t0, dt))
            record("TIMING", "op", level="full", node=slot.node.name, op=slot.op_type, us=dt * 1e6)
            for r in slot.release:
                regs[r] = None
        return [regs[r] for _, r in plan.outputs]

    def by_op(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for _, op, _, dt in self.spans:
            d = out.setdefault(op, {"count": 0, "total_us": 0.0})
            d["count"] += 1
            d["total_us"] += dt * 1e6
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["total_us"]))

    def chrome_trace(self) -> dict[str, Any]:
        return {"traceEvents": [{"name": f"{op} {node}", "cat": op, "ph": "X", "ts": start * 1e6, "dur": dt * 1e6,
                                 "pid": 0, "tid": 0} for node, op, start, dt in self.spans],
                "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str) -> str:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.chrome_trace(), f)
        return path


def profile(engine: Any, feeds: dict[str, Any], outputs: Any = None) -> OpTimer:
    """Time every op of ``engine``'s plan on ``feeds`` (slot by slot; engine state is not touched
    except variables, which ops may update as in a normal call)."""
    from shapeplan.runtime.feeds import to_runtime, validate_feeds
    validate_feeds(engine.graph.inputs, feeds)
    plan = engine.plan(outputs)
    regs: list[Any] = [None] * plan.n_regs
    for name, r in plan.inputs:
        regs[r] = to_runtime(feeds[name], engine.device)
    for r, d in plan.constants:
        regs[r] = engine.constants.get(plan.reg_names[r], d)
    for name, r in plan.variables:
        regs[r] = engine.variables[name]
    t = OpTimer()
    t.run(plan, regs)
    return t
