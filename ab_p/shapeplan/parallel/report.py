"""``StagedEngine.inspect()``: the placement report (which slots live on which device, bytes moved per
step between devices) plus each stage engine's own inspection."""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.parallel.placement import value_nbytes


class StagedInspection:
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.stage_inspections = [st.engine.inspect() for st in engine.stages]

    @property
    def phase(self) -> str:
        """The least advanced phase over the stages (REPLAYING only when every stage replays)."""
        order = ["NOT_RUN", "SLOT_BY_SLOT", "SHAPES_FROZEN", "REPLAY_BLOCKED", "REPLAYING"]
        phases = [i.phase for i in self.stage_inspections]
        return min(phases, key=lambda p: order.index(p) if p in order else 0)

    @property
    def capture_count(self) -> int:
        return sum(i.capture_count for i in self.stage_inspections)

    @property
    def replay_count(self) -> int:
        return sum(i.replay_count for i in self.stage_inspections)

    @property
    def slots(self) -> list[dict[str, Any]]:
        """Every slot of the current plans, tagged with its stage and device."""
        out = []
        for st, ins in zip(self.engine.stages, self.stage_inspections):
            for s in ins.slots:
                out.append({**s, "stage": st.index, "device": st.device, "device_index": st.device_index})
        return out

    @property
    def segments(self) -> list[dict[str, Any]]:
        out = []
        for st, ins in zip(self.engine.stages, self.stage_inspections):
            for seg in ins.segments:
                out.append({**seg, "stage": st.index, "device": st.device})
        return out

    def placement(self) -> dict[str, Any]:
        e = self.engine
        devices = e.devices
        label = [f"{d}#{i}" for i, d in enumerate(devices)]
        stages = []
        for st, ins in zip(e.stages, self.stage_inspections):
            consts = sum(value_nbytes(v) for v in _unique(st.engine.graph.constants))
            kv = sum(value_nbytes(v) for v in st.engine.graph.variables)
            stages.append({"stage": st.index, "device": label[st.device_index], "layers": st.layers,
                           "slots": len(ins.slots), "segments": len(ins.plan.segments),
                           "phase": ins.phase, "constant_bytes": consts, "variable_bytes": kv,
                           "receives": st.receives, "sends": st.sends})
        per_device: dict[str, dict[str, int]] = {}
        for s in stages:
            d = per_device.setdefault(s["device"], {"slots": 0, "constant_bytes": 0, "variable_bytes": 0})
            for k in d:
                d[k] += s[k]
        return {"strategy": e.placement.strategy, "devices": label, "layer_device": list(e.placement.assigned),
                "stages": stages, "per_device": per_device,
                "bytes_per_step": {f"{label[a]}->{label[b]}": n for (a, b), n in e.last_step.items()},
                "bytes_per_step_total": sum(e.last_step.values()),
                "bytes_moved_total": sum(e.moved.values()), "calls": e.calls}

    def report(self) -> dict[str, Any]:
        return {"mode": self.engine.mode, "phase": self.phase, "placement": self.placement(),
                "stages": [i.report() for i in self.stage_inspections]}

    def __repr__(self) -> str:
        p = self.placement()
        st = ", ".join(f"{s['stage']}:{s['device']} layers {s['layers'][0]}-{s['layers'][-1]}" for s in p["stages"])
        return f"<StagedInspection phase={self.phase} stages=[{st}] bytes/step={p['bytes_per_step_total']}>"


def _unique(values: list[Any]) -> list[Any]:
    seen, out = set(), []
    for v in values:
        t = v.data
        key = t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() else id(v)
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out
