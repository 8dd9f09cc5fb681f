"""emulated_replay: the CUDA-graph lifecycle on CPU.

``compile`` turns a segment into one straight-line Python function over the slots' bound kernels
(registers that live only inside the segment become local variables). ``capture`` runs the segment
once while recording the torch call each kernel makes (``emulated_capture``) and binds a replay
program: outputs written in place with ``out=`` into preallocated buffers where that is bit-exact,
direct torch calls without the kernels' wrappers elsewhere, live-outs copied into the runner's stable
buffers; every object it needs is bound at capture, so ``replay`` is one call of one function. Same
ops, same order, same inputs as slot_by_slot: results are bit-identical. When the capture cannot
build the program (a bug, reported as a GRAPH_REPLAY event) the compiled function is replayed instead.

Generated code for a segment ``Add -> Relu`` whose Relu output is read later (``compile``)::

    def segment_0(R, B, f0, f1):
        v5, = f0(R[0], R[3])
        v6, = f1(v5)
        B[6].copy_(v6); R[6] = B[6]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from shapeplan import diagnostics
from shapeplan.errors import ExecutionError, ShapeplanError
from shapeplan.runtime.backends import SegmentContext
from shapeplan.runtime.backends import emulated_capture
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
    run: Callable[[list[Any]], None]                 # the replay: run(regs)
    program: emulated_capture.Program | None = None  # None: replays the compiled function
    replays: int = 0

    def stats(self) -> dict[str, Any]:
        if self.program is None:
            return {"specialised": False}
        return {"specialised": True, "steps": dict(self.program.counts), "pool_bytes": self.program.pool_bytes}


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

    # frozen-plan records (runtime/frozen_records.py): the warm-up records nothing compile needs
    def layouts(self, seg: SegmentContext) -> dict:
        return {}

    def seed(self, seg: SegmentContext, layouts: Any) -> bool:
        return True

    def capture(self, seg: SegmentContext, compiled: Compiled, regs: list[Any]) -> Handle:
        scratch = list(regs)
        steps, produced = emulated_capture.record(seg, scratch)       # this call's results, traced
        program = None
        try:
            bufs, nbytes = emulated_capture.pool(steps, produced, seg)
            program = emulated_capture.build(seg, steps, bufs, nbytes)
        except Exception as e:  # noqa: BLE001 - a capture bug must not cost correctness
            diagnostics.record("GRAPH_REPLAY", "replay program not built: replaying the compiled segment",
                               plan=seg.plan_key, segment=seg.segment.index, reason=f"{type(e).__name__}: {e}")
        del produced
        for r in seg.live_out:
            x, buf = scratch[r], seg.out_buffers.get(r)
            if buf is not None:
                buf.copy_(x)
                x = buf
            regs[r] = x
        if program is not None:
            return Handle(seg, compiled, seg.out_buffers, program.fn, program)
        bufs_, fn, kernels = seg.out_buffers, compiled.fn, compiled.kernels
        return Handle(seg, compiled, bufs_, lambda R: fn(R, bufs_, *kernels))

    def replay(self, handle: Handle, regs: list[Any]) -> None:
        try:
            handle.run(regs)
        except ShapeplanError:
            raise
        except Exception as e:
            raise _locate(handle.seg, regs, e) from e
        handle.replays += 1

    def release(self, handle: Handle) -> None:
        handle.buffers = {}
        handle.run = _released
        handle.program = None


def _released(regs: list[Any]) -> None:
    raise ExecutionError("replay of a released capture (the runner recaptures after a drift)")


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
