"""PlanRunner: one plan specialised to one input-shape signature, with its phase machine.

    SLOT_BY_SLOT --(warmup_calls calls | freeze())--> SHAPES_FROZEN --> REPLAYING
                                                                   \\-> REPLAY_BLOCKED (nothing captured)
    per segment:  NEEDS_WARMUP -> NEEDS_COMPILE -> CAPTURE_PENDING -> REPLAYING
                          \\____________________________________________-> FAILED
    a gap (non-capturable slot) is GAP and always runs slot by slot.

With the defaults call 1 runs slot by slot (shapes recorded, then frozen), call 2 warms each segment up
and compiles it (compiling runs nothing), call 3 captures, and later calls replay. NEEDS_COMPILE is a
resting state only after an address-drift re-warm.
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from shapeplan import diagnostics
from shapeplan.errors import CaptureError, InjectedFault, LifecycleError, ShapeplanError
from shapeplan.plan.buffers import BufferPlan, plan_buffers
from shapeplan.plan.compiler import ABSENT, Plan, host_read_registers
from shapeplan.runtime import faults
from shapeplan.runtime.backends import SegmentBackend, SegmentContext
from shapeplan.runtime.backends.slot_by_slot import run_slot, run_slot_by_slot
from shapeplan.runtime.staging import RegMeta, allocate, staging_buffers


class Phase(str, enum.Enum):
    SLOT_BY_SLOT = "SLOT_BY_SLOT"
    SHAPES_FROZEN = "SHAPES_FROZEN"
    REPLAYING = "REPLAYING"
    REPLAY_BLOCKED = "REPLAY_BLOCKED"


class SegState(str, enum.Enum):
    NEEDS_WARMUP = "NEEDS_WARMUP"
    NEEDS_COMPILE = "NEEDS_COMPILE"
    CAPTURE_PENDING = "CAPTURE_PENDING"
    REPLAYING = "REPLAYING"
    FAILED = "FAILED"
    GAP = "GAP"


@dataclass(slots=True)
class SegRun:
    ctx: SegmentContext
    state: SegState
    volatile_in: tuple[int, ...] = ()       # live-ins not owned by the runner: checked every replay
    compiled: Any = None
    handle: Any = None
    identity: tuple = ()                    # full identity key at capture (all live-ins)
    volatile_key: tuple = ()
    out_ptrs: tuple = ()                    # live-out addresses right after capture
    captures: int = 0
    replays: int = 0
    eager_runs: int = 0
    drifts: int = 0
    reason: str = ""


def _key_of(x: Any) -> tuple:
    if isinstance(x, torch.Tensor):
        return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype)
    return (id(x),)


def identity_key(regs: list[Any], rs: tuple[int, ...]) -> tuple:
    return tuple(_key_of(regs[r]) for r in rs)


class PlanKey(NamedTuple):
    """The plan cache key of a call: one plan per requested outputs, input-shape signature, mode and
    device (invariant 3), and per calling thread (invariant 10)."""
    outputs: tuple[str, ...] | None        # Plan.requested (None: every graph output)
    signature: tuple                       # per input: its shape, (len,) of a sequence, else None
    mode: str                              # Mode.value of the engine's execution mode
    device: str
    thread: int                            # threading.get_ident() of the caller


class PlanRunner:
    """Executes one Plan for one ``PlanKey``."""

    def __init__(self, plan: Plan, key: PlanKey, name: str, *, device: torch.device, backend: SegmentBackend | None,
                 constants: dict[int, Any], variables: dict[str, Any], warmup_calls: int = 1,
                 fallback: bool = True, max_recaptures: int = 3) -> None:
        self.plan, self.key, self.name = plan, key, name
        self.device, self.backend = device, backend
        self.constants = constants                 # register -> engine snapshot tensor
        self.variables = variables                 # the engine's dict (name -> persistent tensor)
        self.warmup_calls, self.fallback, self.max_recaptures = warmup_calls, fallback, max_recaptures
        self.phase = Phase.SLOT_BY_SLOT
        self.calls = 0
        self.meta: dict[int, RegMeta] = {}
        self.const_values: dict[int, Any] = {}
        self.input_dtypes: tuple = ()
        self.segments: list[SegRun] = []
        self.buffers: dict[int, Any] = {}
        self.staging: dict[int, Any] = {}
        self.buffer_plan: BufferPlan | None = None
        self.stable_plan: BufferPlan | None = None
        self.regs: list[Any] = []
        self.lock = threading.Lock()
        self.pins = 0
        self._frozen_release: list[tuple[int, ...]] = []
        self._stage: tuple[tuple[int, Any], ...] = ()      # (placeholder register, staging buffer | None)
        self._vars: tuple[tuple[int, str], ...] = ()       # (variable register, name in engine.variables)
        self._out_regs: tuple[int, ...] = ()
        self._record_key: str | None = None                # frozen_records: this plan's key, once computed
        self._record_used = False                          # frozen from a record (nothing to write back)

    # ------------------------------------------------------------------ bookkeeping
    @property
    def nbytes(self) -> int:
        seen, total = set(), 0
        for t in list(self.buffers.values()) + list(self.staging.values()):
            s = t.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        return total + self.graph_pool_bytes

    @property
    def graph_pool_bytes(self) -> int:
        """Device memory the CUDA graph pool grew by while this plan's segments were captured."""
        return sum(int(getattr(s.handle, "pool_reserved_bytes", 0)) for s in self.segments)

    def _event(self, category: str, message: str, **fields: Any) -> None:
        diagnostics.record(category, message, plan=self.name, **fields)

    # ------------------------------------------------------------------ the call
    def run(self, feeds: list[Any], copy: bool = True) -> list[Any]:
        """``feeds``: runtime values in ``plan.inputs`` order. Returns plan outputs (owned by the caller;
        with ``copy=False`` a frozen plan's are its own buffers: valid until its next call)."""
        if self.phase is Phase.SLOT_BY_SLOT:
            if self.backend is None and self.calls:          # the reference path: nothing to record
                self.calls += 1
                return self._run_plain(feeds)
            if not self.calls and self.backend is not None and self._from_record(feeds):
                with torch.no_grad():
                    outs = self._run_frozen(feeds)
                self.calls += 1
                return outs
            outs = self._run_recording(feeds)
            self.calls += 1
            if self.backend is not None and self.calls >= self.warmup_calls:
                self.freeze()
            return outs
        with torch.no_grad():       # out= replay steps reject autograd; an inference engine records none
            outs = self._run_frozen(feeds, copy)
        self.calls += 1
        return outs

    def prepare(self, feeds: list[Any]) -> bool:
        """Before the first call: freeze from this plan's record and compile (``_from_record``); the
        first call then captures. False when there is no usable record."""
        if self.calls or self.phase is not Phase.SLOT_BY_SLOT or self.backend is None:
            return False
        return self._from_record(feeds)

    def _fresh_registers(self, feeds: list[Any]) -> list[Any]:
        """A register file with the feeds, constants and variables in place."""
        plan = self.plan
        regs: list[Any] = [None] * plan.n_regs
        for (_, r), x in zip(plan.inputs, feeds):
            regs[r] = x
        for r, t in self.constants.items():
            regs[r] = t
        for name, r in plan.variables:
            regs[r] = self.variables[name]
        return regs

    def _run_plain(self, feeds: list[Any]) -> list[Any]:
        return run_slot_by_slot(self.plan, self._fresh_registers(feeds))

    def _run_recording(self, feeds: list[Any]) -> list[Any]:
        plan = self.plan
        regs = self._fresh_registers(feeds)
        meta, const_slots, const_values = self.meta, plan.const_slots, self.const_values
        for r in (r for _, r in plan.inputs):
            if isinstance(regs[r], torch.Tensor):
                meta[r] = RegMeta.of(regs[r])
        for slot in plan.slots:
            run_slot(slot, regs)
            for r in slot.outs:
                if r != ABSENT:
                    x = regs[r]
                    if isinstance(x, torch.Tensor):
                        meta[r] = RegMeta.of(x)
                    if slot.index in const_slots:
                        const_values[r] = x
            for r in slot.release:
                regs[r] = None
        self.input_dtypes = tuple(getattr(x, "dtype", None) for x in feeds)
        self._last_feeds_meta = list(feeds)
        return [regs[r] for _, r in plan.outputs]

    # ------------------------------------------------------------------ frozen-plan records
    def _from_record(self, feeds: list[Any]) -> bool:
        """First call: freeze from this plan's record on disk (``frozen_records``) and compile every
        segment, so this call captures. False (nothing changed) when off, absent or unusable."""
        from shapeplan.runtime import frozen_records as fr
        if self.warmup_calls != 1 or not fr.enabled(self.device) or not hasattr(self.backend, "seed"):
            return False
        try:
            self._record_key = fr.record_key(self.plan, self.constants, self.variables, feeds, self.device,
                                             self.backend.name)
        except Exception as e:  # noqa: BLE001 - e.g. an attribute that cannot be described: no record
            self._event("CACHE", "no frozen-plan record key", reason=f"{type(e).__name__}: {e}"[:200])
            return False
        rec = fr.load(self._record_key)
        if rec is None:
            self._event("CACHE", "no frozen-plan record for this plan", key=self._record_key[:12])
            return False
        try:
            meta = fr.reg_meta(rec)
            const_values = self._const_values_from(meta, feeds)
        except Exception as e:  # noqa: BLE001 - a record this plan cannot use: record as usual
            self._event("CACHE", "frozen-plan record not usable: recording", reason=f"{type(e).__name__}: {e}"[:200])
            return False
        self.meta, self.const_values = meta, const_values
        self.input_dtypes = tuple(getattr(x, "dtype", None) for x in feeds)
        self._last_feeds_meta = list(feeds)
        self._record_used = True
        self.freeze(from_record=True)
        self._event("LIFECYCLE", "shapes frozen from a frozen-plan record", key=self._record_key[:12])
        layouts = rec.get("layouts", {})
        b = self.backend
        for s in self.segments:
            if s.state is not SegState.NEEDS_WARMUP:
                continue
            idx = s.ctx.segment.index
            try:
                if not b.seed(s.ctx, layouts.get(str(idx))):   # type: ignore[union-attr]
                    continue
                s.compiled = b.compile(s.ctx)
                s.state = SegState.CAPTURE_PENDING
                self._event("SEGMENT", "segment compiled from the record", segment=idx, state=s.state)
            except Exception as e:  # noqa: BLE001 - this segment warms up as usual
                self._event("FALLBACK", "segment not compiled from the record: warms up", segment=idx,
                            reason=f"{type(e).__name__}: {e}"[:200])
        return True

    def _const_values_from(self, meta: dict[int, RegMeta], feeds: list[Any]) -> dict[int, Any]:
        """The plan-constant slots' values, computed from the constants (meta tensors of the recorded
        layouts stand in for registers a shape-only op reads); ValueError when one needs real data."""
        plan = self.plan
        regs = self._fresh_registers(feeds)
        out: dict[int, Any] = {}
        for slot in plan.slots:
            if slot.index not in plan.const_slots:
                continue
            for r in slot.ins:
                if r != ABSENT and regs[r] is None:
                    m = meta.get(r)
                    if m is None:
                        raise ValueError(f"the record has no layout for register {plan.reg_names[r]!r}")
                    regs[r] = torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
            run_slot(slot, regs)
            for r in slot.outs:
                if r != ABSENT:
                    x = regs[r]
                    if isinstance(x, torch.Tensor) and x.device.type == "meta":
                        raise ValueError(f"{slot.op_type} needs data to compute {plan.reg_names[r]!r}")
                    out[r] = x
        return out

    def _write_record(self) -> None:
        """After the first REPLAYING: keep what the eager calls recorded for the next process."""
        from shapeplan.runtime import frozen_records as fr
        key = self._record_key
        if key is None or self._record_used or not fr.enabled(self.device) or not hasattr(self.backend, "layouts"):
            return
        if any(s.state is SegState.FAILED for s in self.segments):
            return
        layouts = {s.ctx.segment.index: self.backend.layouts(s.ctx) for s in self.segments  # type: ignore[union-attr]
                   if s.state is SegState.REPLAYING}
        fr.save(key, self.meta, layouts, self.name)

    # ------------------------------------------------------------------ freeze
    def freeze(self, from_record: bool = False) -> None:
        """SLOT_BY_SLOT -> SHAPES_FROZEN: allocate staging + stable buffers, set up segments."""
        if self.phase is not Phase.SLOT_BY_SLOT:
            return
        if not self.calls and not from_record:
            raise LifecycleError(f"plan {self.name}: cannot freeze before one call with this shape signature "
                                 "(shapes are recorded from a real call)")
        plan = self.plan
        for r in host_read_registers(plan):       # plan-constant shapes/axes stay on the host: no sync
            x = self.const_values.get(r)
            if isinstance(x, torch.Tensor) and x.device.type != "cpu":
                self.const_values[r] = x.cpu()
        feeds = self._last_feeds_meta
        staging = staging_buffers(plan.inputs, feeds, self.device)
        nbytes = {r: m.nbytes for r, m in self.meta.items()}
        self.buffer_plan = plan_buffers(plan, nbytes)
        const_regs = set(self.const_values)
        stable: set[int] = set()
        for seg in plan.segments:
            stable.update(seg.live_out)
        out_regs = {r for _, r in plan.outputs}
        pinned_ro = {r for r, _ in plan.constants} | {r for _, r in plan.variables} | {r for _, r in plan.inputs} \
            | {r for _, r in plan.captures}
        stable = {r for r in stable if r in self.meta and r not in const_regs and r not in pinned_ro
                  and r in plan.shape_stable and self.meta[r].dense}
        self.stable_plan = plan_buffers(plan, nbytes, only={r for r in stable if r not in out_regs})
        users: dict[int, int] = {}
        for b in self.stable_plan.assign.values():
            users[b] = users.get(b, 0) + 1
        shared = {r for r, b in self.stable_plan.assign.items() if users[b] > 1}
        buffers = allocate(self.meta, self.stable_plan, stable, self.device)
        self.staging, self.buffers = staging, buffers
        regs: list[Any] = [None] * plan.n_regs
        for r, t in self.constants.items():
            regs[r] = t
        for r, t in self.const_values.items():
            regs[r] = t
        for r, t in staging.items():
            regs[r] = t
        self.regs = regs
        self._stage = tuple((r, staging.get(r)) for _, r in plan.inputs)
        self._vars = tuple((r, name) for name, r in plan.variables)
        self._out_regs = tuple(r for _, r in plan.outputs)
        owned = set(staging) | set(self.constants) | const_regs | set(buffers)
        self._frozen_release = [tuple(r for r in s.release if r not in const_regs and r not in owned)
                                for s in plan.slots]
        self.segments = []
        for seg in plan.segments:
            ctx = SegmentContext(plan, seg, [plan.slots[i] for i in seg.slot_ids], seg.live_in, seg.live_out,
                                 self.device, self.name, {r: buffers[r] for r in seg.live_out if r in buffers},
                                 frozenset(r for r in seg.live_out if r in buffers and r not in shared))
            volatile = tuple(r for r in seg.live_in if r not in owned)
            self.segments.append(SegRun(ctx, SegState.NEEDS_WARMUP if seg.capturable else SegState.GAP, volatile))
        self._last_feeds_meta = []
        self.phase = Phase.SHAPES_FROZEN
        self._event("LIFECYCLE", "shapes frozen", phase=self.phase, segments=len(self.segments),
                    **self.buffer_plan.summary())
        if self.backend is None:
            for s in self.segments:
                if s.state is SegState.NEEDS_WARMUP:
                    s.state, s.reason = SegState.FAILED, "no capture backend in this mode"
                    diagnostics.segment_terminal(self.name, s.ctx.segment.index, "FAILED", s.reason)
            self._block("no capture backend in this mode")
        elif not any(s.state is SegState.NEEDS_WARMUP for s in self.segments):
            self._block("no capturable segment")

    def _block(self, reason: str) -> None:
        self.phase = Phase.REPLAY_BLOCKED
        self._event("LIFECYCLE", f"replay blocked: {reason}", phase=self.phase)
        for s in self.segments:
            if s.state is SegState.GAP:
                diagnostics.segment_terminal(self.name, s.ctx.segment.index, "GAP", s.ctx.segment.reason)

    # ------------------------------------------------------------------ frozen execution
    def _run_frozen(self, feeds: list[Any], copy: bool = True) -> list[Any]:
        """One call after freeze: stage the inputs, then per segment one replay (or its lifecycle step).

        Everything is pre-bound at freeze: (register, staging buffer) pairs, variable registers, output
        registers; a replaying segment is one ``backend.replay`` call over its own pre-bound program."""
        regs = self.regs
        faults.check("staging")
        for (r, buf), x in zip(self._stage, feeds):
            if buf is None:
                regs[r] = x
            elif x is not buf:                  # a staging buffer fed as itself holds its value already
                buf.copy_(x)
        if self._vars:
            variables = self.variables
            for r, name in self._vars:
                regs[r] = variables[name]
        replay = self.backend.replay if self.backend is not None else None
        for s in self.segments:
            if s.state is SegState.REPLAYING:
                if s.volatile_in and identity_key(regs, s.volatile_in) != s.volatile_key:
                    self._drift(s, regs)
                    continue
                replay(s.handle, regs)   # type: ignore[misc]
                s.replays += 1
            elif s.state is SegState.GAP or s.state is SegState.FAILED:
                self._eager(s, regs)
            else:
                self._advance(s, regs)
        if self.phase is Phase.SHAPES_FROZEN:
            self._maybe_promote()
        if not copy:
            return [regs[r] for r in self._out_regs]
        return [x.clone() if isinstance(x, torch.Tensor) else x for x in map(regs.__getitem__, self._out_regs)]

    def _eager(self, s: SegRun, regs: list[Any]) -> None:
        rel = self._frozen_release
        for slot in s.ctx.slots:
            run_slot(slot, regs)
            for r in rel[slot.index]:
                regs[r] = None
        for r, buf in s.ctx.out_buffers.items():
            x = regs[r]
            if x is not buf:
                if isinstance(x, torch.Tensor) and x.shape == buf.shape and x.dtype == buf.dtype:
                    buf.copy_(x)
                    regs[r] = buf
        s.eager_runs += 1

    def _advance(self, s: SegRun, regs: list[Any]) -> None:
        b = self.backend
        assert b is not None
        idx = s.ctx.segment.index
        try:
            if s.state is SegState.NEEDS_WARMUP:
                b.warmup(s.ctx, regs)
                self._place_outputs(s, regs)
                s.state = SegState.NEEDS_COMPILE
                self._event("SEGMENT", "segment warmed up", segment=idx, state=s.state)
                # compile right away (it runs nothing): the next call captures, one eager call sooner
                s.compiled = b.compile(s.ctx)
                s.state = SegState.CAPTURE_PENDING
                self._event("SEGMENT", "segment compiled", segment=idx, state=s.state)
            elif s.state is SegState.NEEDS_COMPILE:       # after an address drift re-warm
                s.compiled = b.compile(s.ctx)
                s.state = SegState.CAPTURE_PENDING
                self._event("SEGMENT", "segment compiled", segment=idx, state=s.state)
                self._eager(s, regs)
            elif s.state is SegState.CAPTURE_PENDING:
                faults.check("capture")
                s.identity = identity_key(regs, self._owned_in(s))
                s.volatile_key = identity_key(regs, s.volatile_in)
                s.handle = b.capture(s.ctx, s.compiled, regs)
                s.out_ptrs = identity_key(regs, tuple(s.ctx.out_buffers))
                s.captures += 1
                s.state = SegState.REPLAYING
                self._event("GRAPH_REPLAY", "segment captured", segment=idx, captures=s.captures)
        except ShapeplanError as e:
            if isinstance(e, InjectedFault) and e.step == "capture":
                raise                      # a fault leaves the segment where it was; clearing it recovers
            self._fail(s, f"{type(e).__name__}: {e}", regs, e)
        except Exception as e:  # noqa: BLE001 - a backend bug must not kill the engine
            self._fail(s, f"{type(e).__name__}: {e}", regs, e)

    def _fail(self, s: SegRun, reason: str, regs: list[Any], err: Exception) -> None:
        s.state = SegState.FAILED
        s.reason = reason
        diagnostics.segment_terminal(self.name, s.ctx.segment.index, "FAILED", reason)
        if not self.fallback:
            raise CaptureError(f"plan {self.name} segment {s.ctx.segment.index}: {reason}") from err
        self._event("FALLBACK", "segment falls back to slot-by-slot", segment=s.ctx.segment.index, reason=reason)
        self._eager(s, regs)

    def _place_outputs(self, s: SegRun, regs: list[Any]) -> None:
        for r, buf in s.ctx.out_buffers.items():
            x = regs[r]
            if isinstance(x, torch.Tensor) and x is not buf and x.shape == buf.shape and x.dtype == buf.dtype:
                buf.copy_(x)
                regs[r] = buf

    def _drift(self, s: SegRun, regs: list[Any]) -> None:
        new = identity_key(regs, s.volatile_in)
        changed = [self.plan.reg_names[r] for r, a, b in zip(s.volatile_in, s.volatile_key, new) if a != b]
        s.drifts += 1
        self._event("GRAPH_REPLAY", "address drift: re-warm and recapture", segment=s.ctx.segment.index,
                    changed=changed, drifts=s.drifts)
        if self.backend is not None and s.handle is not None:
            self.backend.release(s.handle)
        s.handle = None
        if s.drifts > self.max_recaptures:
            s.state = SegState.FAILED
            s.reason = f"identity changed {s.drifts} times (inputs {changed}); runs slot by slot"
            diagnostics.segment_terminal(self.name, s.ctx.segment.index, "FAILED", s.reason)
            self._eager(s, regs)
            return
        self._eager(s, regs)              # the re-warm run
        s.state = SegState.CAPTURE_PENDING if s.compiled is not None else SegState.NEEDS_COMPILE

    def _maybe_promote(self) -> None:
        states = [s.state for s in self.segments if s.state is not SegState.GAP]
        if any(st in (SegState.NEEDS_WARMUP, SegState.NEEDS_COMPILE, SegState.CAPTURE_PENDING) for st in states):
            return
        if any(st is SegState.REPLAYING for st in states):
            self.phase = Phase.REPLAYING
            self._event("LIFECYCLE", "replaying", phase=self.phase, calls=self.calls + 1)
            self._write_record()
            for s in self.segments:
                st = "REPLAYING" if s.state is SegState.REPLAYING else s.state.value
                why = "captured" if s.state is SegState.REPLAYING else (s.reason or s.ctx.segment.reason)
                diagnostics.segment_terminal(self.name, s.ctx.segment.index, st, why)
        else:
            self._block("every capturable segment failed")

    # ------------------------------------------------------------------ checks
    def address_drift(self) -> list[str]:
        """Segments whose live-in or live-out addresses differ from those recorded at capture."""
        out = []
        for s in self.segments:
            if s.state is not SegState.REPLAYING:
                continue
            if identity_key(self.regs, self._owned_in(s)) != s.identity:
                out.append(f"segment {s.ctx.segment.index}: live-in identity changed")
            if identity_key(self.regs, tuple(s.ctx.out_buffers)) != s.out_ptrs:
                out.append(f"segment {s.ctx.segment.index}: live-out addresses changed")
        return out

    @staticmethod
    def _owned_in(s: SegRun) -> tuple[int, ...]:
        return tuple(r for r in s.ctx.live_in if r not in s.volatile_in)

    def release(self) -> None:
        for s in self.segments:
            if s.handle is not None and self.backend is not None:
                self.backend.release(s.handle)
                s.handle = None
