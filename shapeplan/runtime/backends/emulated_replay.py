"""emulated_replay: the CUDA-graph lifecycle on CPU.

``compile`` turns a segment into one straight-line Python function (registers that live only inside
the segment become local variables, so they are freed as soon as their last reader ran); ``capture``
runs it once and records where each live-out landed: the runner's stable buffers, written in place
with ``copy_``. ``replay`` calls the function again. Same kernels, same order, same inputs as
slot_by_slot, so results are bit-identical.

Generated code for a segment ``Add -> Relu`` whose Relu output is read later::

    def segment_0(R, B, f0, f1):
        v5, = f0(R[0], R[3])
        v6, = f1(v5)
        B[6].copy_(v6); R[6] = B[6]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from shapeplan.errors import ExecutionError, ShapeplanError
from shapeplan.runtime.backends import SegmentContext
from shapeplan.runtime.backends.slot_by_slot import describe_inputs, run_slot

ABSENT = -1


@dataclass(slots=True)
class Compiled:
    fn: Callable[..., None]
    source: str
    kernels: tuple[Callable[..., tuple], ...]


@dataclass(slots=True)
class Handle:
    seg: SegmentContext
    compiled: Compiled
    buffers: dict[int, Any]
    replays: int = 0


def generate(seg: SegmentContext) -> Compiled:
    live_out = set(seg.live_out)
    inside: set[int] = set()
    lines = [f"def segment_{seg.segment.index}(R, B, {', '.join(f'f{i}' for i in range(len(seg.slots))) or '_'}):"]
    for i, slot in enumerate(seg.slots):
        args = []
        for r in slot.ins:
            if r == ABSENT:
                args.append("None")
            elif r in inside:
                args.append(f"v{r}")
            else:
                args.append(f"R[{r}]")
        targets = [f"v{r}" if r != ABSENT else "_" for r in slot.outs]
        lines.append(f"    {', '.join(targets)}, = f{i}({', '.join(args)})")
        inside.update(r for r in slot.outs if r != ABSENT)
        for r in slot.release:                  # free early, like slot_by_slot
            if r in inside and r not in live_out:
                lines.append(f"    del v{r}")
    for r in seg.live_out:
        if r in seg.out_buffers:
            lines.append(f"    B[{r}].copy_(v{r}); R[{r}] = B[{r}]")
        else:                                    # not a tensor of a stable shape: pass it through
            lines.append(f"    R[{r}] = v{r}")
    if len(lines) == 1:
        lines.append("    pass")
    src = "\n".join(lines) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<shapeplan segment {seg.plan_key}:{seg.segment.index}>", "exec"), ns)  # noqa: S102
    return Compiled(ns[f"segment_{seg.segment.index}"], src, tuple(s.fn for s in seg.slots))


class EmulatedReplayBackend:
    name = "emulated_replay"

    def available(self, device: torch.device) -> str | None:
        return None

    def warmup(self, seg: SegmentContext, regs: list[Any]) -> None:
        for slot in seg.slots:
            run_slot(slot, regs)

    def compile(self, seg: SegmentContext) -> Compiled:
        return generate(seg)

    def capture(self, seg: SegmentContext, compiled: Compiled, regs: list[Any]) -> Handle:
        h = Handle(seg, compiled, seg.out_buffers)
        self.replay(h, regs)
        return h

    def replay(self, handle: Handle, regs: list[Any]) -> None:
        c = handle.compiled
        try:
            c.fn(regs, handle.buffers, *c.kernels)
        except ShapeplanError:
            raise
        except Exception as e:
            raise _locate(handle.seg, regs, e) from e
        handle.replays += 1

    def release(self, handle: Handle) -> None:
        handle.buffers = {}


def _locate(seg: SegmentContext, regs: list[Any], e: Exception) -> ExecutionError:
    """Re-run slot by slot on a scratch copy to name the failing node (error path only)."""
    scratch = list(regs)
    for slot in seg.slots:
        try:
            run_slot(slot, scratch)
        except ExecutionError as located:
            return located
    return ExecutionError(f"segment {seg.segment.index} of plan {seg.plan_key} failed during replay: "
                          f"{type(e).__name__}: {e}")


__all__ = ["EmulatedReplayBackend", "generate", "describe_inputs"]
