"""``engine.inspect()``: a snapshot of the current plan (the one the last call used) and its runner."""
from __future__ import annotations

from typing import Any

from shapeplan.plan.compiler import ABSENT


class Inspection:
    def __init__(self, engine: Any, runner: Any) -> None:
        self.engine, self.runner = engine, runner
        self.plan = runner.plan if runner is not None else engine.plan()

    @property
    def phase(self) -> str:
        return self.runner.phase.value if self.runner is not None else "NOT_RUN"

    @property
    def segments(self) -> list[dict[str, Any]]:
        out = []
        runs = {s.ctx.segment.index: s for s in (self.runner.segments if self.runner is not None else [])}
        for seg in self.plan.segments:
            d = seg.to_json()
            d["ops"] = [self.plan.slots[i].op_type for i in seg.slot_ids]
            s = runs.get(seg.index)
            if s is not None:
                d.update(state=s.state.value, captures=s.captures, replays=s.replays, eager_runs=s.eager_runs,
                         drifts=s.drifts, failure=s.reason or None)
                if hasattr(s.handle, "stats"):          # cuda_graphs / triton: pool bytes, fused steps
                    d["capture"] = s.handle.stats()
            else:
                d.update(state="NOT_FROZEN" if seg.capturable else "GAP", captures=0, replays=0)
            out.append(d)
        return out

    @property
    def slots(self) -> list[dict[str, Any]]:
        p = self.plan
        seg_of = {i: seg.index for seg in p.segments for i in seg.slot_ids}
        meta = self.runner.meta if self.runner is not None else {}
        names = p.reg_names
        res = []
        for s in p.slots:
            res.append({"index": s.index, "op_type": s.op_type, "node": s.node.name,
                        "inputs": [None if r == ABSENT else names[r] for r in s.ins],
                        "outputs": [None if r == ABSENT else names[r] for r in s.outs],
                        "in_regs": list(s.ins), "out_regs": list(s.outs),
                        "release": [names[r] for r in s.release], "segment": seg_of.get(s.index),
                        "const": s.index in p.const_slots, "capturable": s.opdef.capturable,
                        "shapes": [list(meta[r].shape) if r in meta else None for r in s.outs]})
        return res

    @property
    def capture_count(self) -> int:
        return sum(s.captures for s in self.runner.segments) if self.runner is not None else 0

    @property
    def replay_count(self) -> int:
        return sum(s.replays for s in self.runner.segments) if self.runner is not None else 0

    @property
    def calls(self) -> int:
        return self.runner.calls if self.runner is not None else 0

    def buffers(self) -> dict[str, Any]:
        r = self.runner
        if r is None or r.buffer_plan is None:
            return {}
        return {"all_intermediates": r.buffer_plan.summary(),
                "stable": r.stable_plan.summary() if r.stable_plan else None, "bytes_allocated": r.nbytes}

    def to_dot(self) -> str:
        states = {s.ctx.segment.index: s.state.value for s in self.runner.segments} if self.runner else None
        return self.plan.to_dot(states=states, name=self.plan.graph.name)

    def plans(self) -> list[dict[str, Any]]:
        out = []
        for r in self.engine.runners():
            out.append({"name": r.name, "outputs": r.plan.output_names, "signature": [list(s) if s else s for s in r.key.signature],
                        "mode": r.key.mode, "device": r.key.device, "phase": r.phase.value, "calls": r.calls,
                        "segments": len(r.plan.segments), "bytes": r.nbytes,
                        "graph_pool_bytes": getattr(r, "graph_pool_bytes", 0)})
        return out

    def report(self) -> dict[str, Any]:
        e = self.engine
        return {"mode": e.mode.value, "running_mode": e.exec_mode.value, "device": str(e.device),
                "phase": self.phase, "plan": self.runner.name if self.runner else None,
                "summary": self.plan.summary(), "calls": self.calls, "captures": self.capture_count,
                "replays": self.replay_count, "segments": self.segments, "slots": self.slots,
                "buffers": self.buffers(), "plans": self.plans(), "cache": e.cache.stats()}

    def __repr__(self) -> str:
        segs = ", ".join(f"{s['index']}:{s['state']}" for s in self.segments)
        return f"<Inspection phase={self.phase} segments=[{segs}] captures={self.capture_count} " \
               f"replays={self.replay_count}>"
