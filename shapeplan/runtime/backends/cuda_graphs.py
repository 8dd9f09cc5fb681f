"""cuda_graphs: capture a segment with ``torch.cuda.CUDAGraph`` and replay it with one launch.

Lifecycle (the runner drives it, docs/runtime.md):

* ``warmup``: run the segment eagerly (allocator, cuBLAS handles, lazy module loads warm up), and record
  the layout of every register (the Triton backend builds its kernels from it).
* ``compile``: the steps to capture: one per slot here; the Triton backend fuses some.
* ``capture`` (serialized per device): run the steps eagerly once (this call's results, Triton JIT
  happens here, outside the capture), then record them into a graph (the Triton backend skips the
  eager run when every step is known to work: ``_capture_first``; one replay gives the results) that allocates from the engine's
  **one graph memory pool**; each live-out is copied, inside the graph, into the runner's stable
  buffer, so the next island or gap reads a fixed address. An out-of-memory during capture empties
  the cache and retries (bounded); when it still fails the segment is *deferred*: it runs eagerly into
  the same stable buffers and capture is retried on later calls, then given up with a FALLBACK event.
* ``replay``: ``graph.replay()``; after 3 replays the handle takes a fast path that only launches.

Replay outputs sit in buffers that the next replay overwrites; the runner clones plan outputs before
returning them (``zero_copy`` engines hand out the buffers themselves, valid until the next call).
Plans sharing a pool must not replay concurrently: the runner runs one plan per engine at a time
(``pool_lock`` guards a replay for callers that do not).
"""
from __future__ import annotations

import gc
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from shapeplan import diagnostics, env
from shapeplan.errors import CaptureError
from shapeplan.runtime.backends import SegmentContext, register_backend
from shapeplan.runtime import faults
from shapeplan.runtime.backends.slot_by_slot import call_kernel, describe_inputs

ABSENT = -1
FAST_PATH_AFTER = 3


@dataclass(slots=True)
class Step:
    """One launch-level unit of a segment: a slot's kernel, or a fused kernel standing for several slots."""
    fn: Callable[..., tuple]
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    release: tuple[int, ...]              # segment-internal registers last read here
    members: tuple[Any, ...]              # the Slot(s) it computes
    kind: str = "slot"                    # slot | fused | kernel

    def describe(self) -> str:
        if len(self.members) == 1:
            return self.members[0].node.describe()
        return f"fused {self.kind} of [{'; '.join(m.node.describe() for m in self.members)}]"


def slot_steps(seg: SegmentContext) -> list[Step]:
    """One Step per slot; releases only registers born and dead inside the segment."""
    inside = {r for s in seg.slots for r in s.outs if r != ABSENT}
    keep = set(seg.live_out) | set(seg.live_in)
    return [Step(s.fn, tuple(s.ins), tuple(s.outs),
                 tuple(r for r in s.release if r in inside and r not in keep), (s,)) for s in seg.slots]


def run_steps(steps: list[Step], regs: list[Any]) -> None:
    for st in steps:
        call_kernel(st.fn, st.ins, st.outs, regs, lambda st=st: (
            f"{st.describe()} with inputs "
            f"({describe_inputs(st.members[0], regs) if len(st.members) == 1 else len(st.ins)})"))
        for r in st.release:
            regs[r] = None


# ---- per-engine pool, per-device capture lock ----------------------------------------------------------

_pools: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()
_pool_locks: dict[int, threading.Lock] = {}
_capture_locks: dict[int, threading.Lock] = {}
_guard = threading.Lock()


def _pool_owner(seg: SegmentContext) -> Any:
    return getattr(seg, "engine", None) or seg.plan.graph


def graph_pool(seg: SegmentContext) -> Any:
    """The graph memory pool shared by every plan of the engine that owns ``seg`` (one per device)."""
    owner = _pool_owner(seg)
    dev = seg.device.index if seg.device.index is not None else torch.cuda.current_device()
    with _guard:
        pools = _pools.setdefault(owner, {})
        if dev not in pools:
            pools[dev] = torch.cuda.graph_pool_handle()
            _pool_locks[id(pools[dev])] = threading.Lock()
        return pools[dev]


def capture_lock(device: torch.device) -> threading.Lock:
    dev = device.index if device.index is not None else torch.cuda.current_device()
    with _guard:
        return _capture_locks.setdefault(dev, threading.Lock())


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


@dataclass(slots=True)
class GraphHandle:
    seg: SegmentContext
    steps: list[Step]
    graph: Any = None                       # torch.cuda.CUDAGraph, None while deferred / given up
    bind: tuple[tuple[int, Any], ...] = ()  # live-out register -> stable tensor after each replay
    pool_lock: Any = None
    pool_reserved_bytes: int = 0            # growth of reserved device memory during this capture
    output_bytes: int = 0                   # bytes of the stable live-out tensors
    capture_s: float = 0.0
    replays: int = 0
    deferrals: int = 0
    eager: bool = False                     # capture given up: run eagerly into the stable buffers
    fast: bool = False
    #: SHAPEPLAN_TRITON_VERIFY, read when the segment is captured (never on a replay)
    verify: bool = field(default_factory=lambda: _verify_on())

    def stats(self) -> dict[str, Any]:
        return {"captured": self.graph is not None, "replays": self.replays, "deferrals": self.deferrals,
                "pool_reserved_bytes": self.pool_reserved_bytes, "output_bytes": self.output_bytes,
                "capture_s": round(self.capture_s, 4), "steps": len(self.steps),
                "fused_steps": sum(1 for s in self.steps if s.kind != "slot")}


class CudaGraphsBackend:
    name = "cuda_graphs"
    capture_retries = 2          # OOM: empty the cache and try again this many times within one call
    max_deferrals = 3            # then defer to later calls this many times before giving up

    # ---- interface ------------------------------------------------------------------------------
    def available(self, device: torch.device) -> str | None:
        if device.type != "cuda":
            return f"{self.name} needs a CUDA device, the engine runs on {device}"
        if not torch.cuda.is_available():
            return f"{self.name}: torch.cuda is not available (torch {torch.__version__})"
        return None

    def warmup(self, seg: SegmentContext, regs: list[Any]) -> None:
        steps = slot_steps(seg)
        for st in steps:
            run_steps([st], regs)
            self._observe(seg, st, regs)

    def compile(self, seg: SegmentContext) -> list[Step]:
        return slot_steps(seg)

    # frozen-plan records (runtime/frozen_records.py): what compile needs from the warm-up, kept on disk;
    # ``seed`` gives it back (True: the segment may compile without warming up)
    def layouts(self, seg: SegmentContext) -> Any:
        return {}

    def seed(self, seg: SegmentContext, layouts: Any) -> bool:
        return True

    def capture(self, seg: SegmentContext, compiled: list[Step], regs: list[Any]) -> GraphHandle:
        h = GraphHandle(seg, compiled)
        with capture_lock(seg.device):
            if self._capture_first(seg, h.steps, regs) and self._first_capture(h, regs):
                return h
            h.steps = self._checked_eager(seg, h.steps, regs)       # this call's results + JIT warm-up
            diagnostics.record("SEGMENT", "eager run before capture done", plan=seg.plan_key,
                               segment=seg.segment.index)
            self._try_capture(h, regs)
        return h

    def _first_capture(self, h: GraphHandle, regs: list[Any]) -> bool:
        """Capture without an eager run, then one replay gives this call's results. False (nothing
        launched, ``regs`` untouched) when it did not capture: the caller runs the eager path."""
        seg = h.seg
        try:
            self._try_capture(h, regs, replay=True)
        except CaptureError as e:
            h.graph = None
            diagnostics.record("FALLBACK", "capture before an eager run failed: running it eagerly first",
                               plan=seg.plan_key, segment=seg.segment.index, reason=str(e)[:300])
            return False
        if h.graph is None:                       # deferred after out-of-memory
            return False
        diagnostics.record("SEGMENT", "captured before any eager run; replayed for this call",
                           plan=seg.plan_key, segment=seg.segment.index)
        return True

    def replay(self, handle: GraphHandle, regs: list[Any]) -> None:
        if handle.fast:
            handle.graph.replay()
            for r, t in handle.bind:
                regs[r] = t
            return
        if handle.graph is None:
            self._uncaptured(handle, regs)
            return
        handle.graph.replay()
        for r, t in handle.bind:
            regs[r] = t
        handle.replays += 1
        if handle.replays >= FAST_PATH_AFTER and not handle.verify:
            handle.fast = True

    def release(self, handle: GraphHandle) -> None:
        handle.graph = None
        handle.bind = ()
        handle.fast = False

    # ---- hooks for the Triton backend ---------------------------------------------------------------
    def _observe(self, seg: SegmentContext, step: Step, regs: list[Any]) -> None:
        """Called after each warm-up step with its outputs in ``regs``."""

    def _capture_first(self, seg: SegmentContext, steps: list[Step], regs: list[Any]) -> bool:
        """Whether ``capture`` may record ``steps`` before running them once (see the Triton backend).
        Here never: the eager run is what loads each kernel before the capture."""
        return False

    def _checked_eager(self, seg: SegmentContext, steps: list[Step], regs: list[Any]) -> list[Step]:
        """Run ``steps`` eagerly into ``regs`` (live-outs land in the stable buffers); return the steps."""
        run_steps(steps, regs)
        _to_stable(seg, regs)
        return steps

    # ---- capture ------------------------------------------------------------------------------------
    def _try_capture(self, h: GraphHandle, regs: list[Any], replay: bool = False) -> None:
        seg = h.seg
        for attempt in range(self.capture_retries + 1):
            try:
                self._capture_once(h, regs, replay)
                return
            except Exception as e:  # noqa: BLE001
                if not _is_oom(e):
                    raise CaptureError(f"plan {seg.plan_key} segment {seg.segment.index}: capture failed: "
                                       f"{type(e).__name__}: {e}") from e
                h.graph = None
                torch.cuda.synchronize(seg.device)
                torch.cuda.empty_cache()
                diagnostics.record("MEMORY", "out of memory during capture: cache emptied, retrying",
                                   plan=seg.plan_key, segment=seg.segment.index, attempt=attempt + 1)
        h.deferrals += 1
        diagnostics.record("GRAPH_REPLAY", "capture deferred after out-of-memory", plan=seg.plan_key,
                           segment=seg.segment.index, deferrals=h.deferrals)

    def _capture_once(self, h: GraphHandle, regs: list[Any], replay: bool = False) -> None:
        """Record ``h.steps`` into a graph. ``regs`` hold this call's results from an eager run (copied
        into the graph's live-out tensors), or with ``replay`` nothing yet: one replay computes them."""
        seg = h.seg
        if faults.active("capture_oom"):
            raise torch.cuda.OutOfMemoryError("injected fault: out of memory during capture (SHAPEPLAN_FAULT)")
        pool = graph_pool(seg)
        h.pool_lock = _pool_locks[id(pool)]
        t0 = time.perf_counter()
        reserved0 = torch.cuda.memory_reserved(seg.device)
        g = torch.cuda.CUDAGraph()
        scratch = list(regs)
        bufs = seg.out_buffers
        # no garbage collection while capturing: a collection can free an unreachable engine's CUDA graph
        # on this thread, and destroying a graph is not permitted during a capture (it invalidates this
        # one). torch.cuda.graph no longer collects before it captures (torch 2.11). Collected afterwards.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
                run_steps(h.steps, scratch)
                for r in seg.live_out:
                    buf = bufs.get(r)
                    if buf is not None and scratch[r] is not buf:
                        buf.copy_(scratch[r])
        finally:
            if collecting:
                gc.enable()
        bind = []
        for r in seg.live_out:
            t = bufs.get(r, scratch[r])
            if not replay and t is not regs[r] and isinstance(t, torch.Tensor) and isinstance(regs[r], torch.Tensor):
                t.copy_(regs[r])                  # this call's eager result, into the graph's own tensor
            bind.append((r, t))
        del scratch
        if replay:
            g.replay()                            # this call's results
        h.graph, h.bind = g, tuple(bind)
        for r, t in bind:
            regs[r] = t
        h.output_bytes = sum(t.numel() * t.element_size() for _, t in bind if isinstance(t, torch.Tensor))
        h.pool_reserved_bytes = max(0, torch.cuda.memory_reserved(seg.device) - reserved0)
        h.capture_s = time.perf_counter() - t0

    def _uncaptured(self, h: GraphHandle, regs: list[Any]) -> None:
        """Deferred (OOM) or given up: run eagerly into stable buffers; retry capture while allowed."""
        seg = h.seg
        with capture_lock(seg.device) if not h.eager else _nolock():
            run_steps(h.steps, regs)
            _to_stable(seg, regs)
            if h.eager:
                return
            self._try_capture(h, regs)
            if h.graph is None and h.deferrals > self.max_deferrals:
                h.eager = True
                reason = f"capture ran out of memory {h.deferrals} times; runs eagerly"
                diagnostics.record("FALLBACK", "segment not captured: " + reason, plan=seg.plan_key,
                                   segment=seg.segment.index)
                diagnostics.segment_terminal(seg.plan_key, seg.segment.index, "FAILED", reason)


class _nolock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _to_stable(seg: SegmentContext, regs: list[Any]) -> None:
    for r, buf in seg.out_buffers.items():
        x = regs[r]
        if x is not buf and isinstance(x, torch.Tensor) and x.shape == buf.shape and x.dtype == buf.dtype:
            buf.copy_(x)
            regs[r] = buf


def _verify_on() -> bool:
    """``SHAPEPLAN_TRITON_VERIFY`` now (capture time; a replay reads ``GraphHandle.verify``)."""
    return env.get("SHAPEPLAN_TRITON_VERIFY")


def pool_bytes(handles: list[Any]) -> dict[str, int]:
    """Device bytes of a plan's captured segments (for ``engine.inspect()`` and the cache budget)."""
    hs = [h for h in handles if isinstance(h, GraphHandle)]
    return {"graph_pool_bytes": sum(h.pool_reserved_bytes for h in hs),
            "graph_output_bytes": sum(h.output_bytes for h in hs)}


def graph_pools_reserved(device: torch.device) -> int:
    """Device bytes the caching allocator holds on ``device`` in CUDA-graph memory pools: the segments of its
    snapshot outside the default pool (id (0, 0)). Unlike a difference of ``memory_reserved`` around the
    captures, no other tensor's free or cache release moves it."""
    dev = device.index if device.index is not None else torch.cuda.current_device()
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if s["device"] == dev and tuple(s["segment_pool_id"]) != (0, 0))


register_backend("cuda_graphs", CudaGraphsBackend)

__all__ = ["CudaGraphsBackend", "GraphHandle", "Step", "graph_pool", "graph_pools_reserved", "pool_bytes", "run_steps",
           "slot_steps"]
