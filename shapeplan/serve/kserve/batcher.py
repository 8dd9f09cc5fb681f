"""One model instance: a worker thread that owns an engine and runs every request for it.

DESIGN invariant 10: plan keys include the calling thread, so only this thread calls the engine; the
HTTP / gRPC handlers hand requests over the model's queue and wait on a future.

Dynamic batching: when the worker gets free it takes every request already queued (up to the largest
batch); only when it was idle, with nothing queued, does it wait up to ``max_queue_delay_us`` after the
first request for more (stopping early once the batch is full). It groups what it has by compatibility
(the same non-batch dimensions), decides per group whether to run it whole or only the head that
fills a smaller bucket (``batching.fit``; the rest goes first into the next call), copies the rows
into the instance's staging buffers (one per input: ``[max_batch_size, ...]``, pinned for a CUDA
engine, so the host-to-device copy is one DMA), pads them up to the next size in a small ladder of
buckets (1, 2, 4, ... max_batch_size) by repeating the last row, runs one engine call (always for every
output: a request's subset is picked from the result, so requested outputs do not multiply the plans),
and hands each request its own rows: results for asyncio callers (the gRPC and HTTP handlers) go to
their event loop in one hand-off per batch, not one wake-up per request. Only the bucket sizes ever
get a plan; they are compiled, captured and pinned in the engine's plan cache at start-up (warm-up), so
no request pays for a capture and no bucket is evicted. When a batched call fails, its requests are
re-run one by one, so an error reaches only the request that caused it.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import warnings
from typing import Any

import numpy as np
import torch

from shapeplan import diagnostics
from shapeplan.ir.tensors import runtime_to_numpy
from shapeplan.serve.kserve.batching import (Costs, Done, Work, bucket_of, deliver, fit, groups_of, split,
                                             stack)

log = logging.getLogger("shapeplan.serve")

# requests' arrays are read-only views of the received messages; torch only reads them (into staging)
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning,
                        module=__name__)

#: instances compile and warm up one at a time: engine creation has process-wide lazy set-up that is not
#: thread-safe (two engines created at once on two threads could get no capture backend: backends/
#: __init__.py's _ensure_builtin), and on a GPU one capture at a time keeps start-up predictable
_LOAD_LOCK = threading.Lock()

WARMUP_CALLS = 5           # upper bound on warm-up calls per bucket (REPLAYING after 3 on CPU and CUDA today)
STAGING_SHAPES = 8         # staging buffer sets kept per instance (one per distinct non-batch shape)


class Batcher:
    def __init__(self, model: Any, index: int) -> None:
        self.model, self.index = model, index
        self.engine: Any = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._pins = contextlib.ExitStack()
        self._staging: dict[tuple, dict[str, torch.Tensor] | None] = {}    # key -> input name -> buffer
        self._carry: list[Work] = []        # requests ``fit`` left for the next call (they go first)
        self.costs = Costs()
        self._thread = threading.Thread(target=self._main, name=f"shapeplan-serve-{model.name}-{index}",
                                        daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def wait_ready(self) -> None:
        self._ready.wait()
        if self.error is not None:
            raise self.error

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join()

    def _main(self) -> None:
        try:
            with _LOAD_LOCK:
                self._load()
        except BaseException as e:  # noqa: BLE001 - handed to the thread that starts the server
            self.error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self._serve()
        finally:
            self._pins.close()
            self.engine.close()

    def _load(self) -> None:
        import shapeplan as sp
        cfg = self.model.config
        t0 = time.perf_counter()
        if self.model.path.endswith(".pt2"):
            import torch
            src: Any = torch.export.load(self.model.path)       # pickle inside: serve trusted files only
        else:
            src = self.model.path
        self.engine = sp.compile(src, device=cfg.device, mode=cfg.mode)
        spec = self.model.describe(self.engine.graph)
        self._warm_up(spec)
        log.info("model %s (instance %d) ready in %.1f s: %s, buckets %s, %d plan(s) pinned", self.model.name,
                 self.index, time.perf_counter() - t0, self.engine.exec_mode.value, list(spec.buckets) or "-",
                 len(self.engine.cache.keys()))

    # ------------------------------------------------------------------ warm-up
    def _warm_up(self, spec: Any) -> None:
        """Run each bucket (or the one fixed shape) until its plan replays, then pin every plan."""
        first = 1 if spec.max_batch_size else 0
        if not all(isinstance(d, int) for t in spec.inputs for d in t.shape[first:]):
            diagnostics.record("SERVE", "no warm-up: an input has a varying non-batch dimension",
                               model=self.model.name)
            return
        from shapeplan.serve.kserve.protocol import DATATYPES
        from shapeplan.runtime.runner import Phase
        sizes = spec.buckets or ((1,) if spec.max_batch_size else (None,))
        for size in sizes:
            zeros = {t.name: np.zeros(((size,) if size else ()) + tuple(t.shape[first:]), DATATYPES[t.datatype][0])
                     for t in spec.inputs}
            key = tuple(a.shape[1:] for a in zeros.values())
            batch = [Work(zeros, None, size, key, None, 0)] if size and spec.batching else None
            try:
                replayed = False
                for _ in range(WARMUP_CALLS):          # until the plan replays (or cannot), plus one replay
                    t0 = time.perf_counter()
                    # batches take the serving path (staging buffers, torch in): its first-time work is done here
                    staged = self._stage(batch, size) if batch else None
                    feeds: dict[str, Any] = staged if staged is not None else zeros
                    out = self.engine.run(feeds)
                    if staged is not None:
                        out = self._to_numpy(out, staged)
                    took = time.perf_counter() - t0
                    phase = self.engine.inspect().phase
                    if phase == Phase.REPLAY_BLOCKED.value or (phase == Phase.REPLAYING.value and replayed):
                        break
                    replayed = phase == Phase.REPLAYING.value
            except Exception as e:  # noqa: BLE001 - zeros may be invalid input for this model: warm up on requests
                diagnostics.record("SERVE", "warm-up stopped: the model rejects zero inputs", model=self.model.name,
                                   error=f"{type(e).__name__}: {e}")
                log.warning("model %s: warm-up on zeros failed (%s: %s); plans are made by the first requests",
                            self.model.name, type(e).__name__, e)
                break
            if size and spec.batching and not self._splits(out, size):
                break
            if size:
                self.costs.add(key, size, took)
        for key in self.engine.cache.keys():
            self._pins.enter_context(self.engine.cache.pinned(key))

    def _splits(self, out: dict[str, Any], size: int) -> bool:
        """Every output's first dimension is the batch: else dynamic batching is turned off (visible)."""
        bad = [k for k, v in out.items() if getattr(v, "ndim", 0) == 0 or v.shape[0] != size]
        if bad:
            self._no_batching(f"output(s) {bad} do not have the batch as their first dimension")
        return not bad

    def _no_batching(self, why: str) -> None:
        spec = self.model.spec
        if spec.batching:
            spec.batching, spec.buckets = False, ()
            diagnostics.record("FALLBACK", "dynamic batching off", model=self.model.name, reason=why)
            log.warning("model %s: dynamic batching off: %s", self.model.name, why)

    # ------------------------------------------------------------------ serving
    def _serve(self) -> None:
        while True:
            works, stop = self._gather()
            for group in self._groups(works):
                if self.model.spec.batching and not stop:
                    group, later = fit(group, self.model.spec.buckets, self.costs)
                    self._carry += later
                self._run(group)
            if stop:
                return

    def _gather(self) -> tuple[list[Work], bool]:
        """The next requests: every one already queued (up to a full batch); when nothing was queued,
        the first to come and those that come within the batching window."""
        q = self.model.queue
        works, self._carry = self._carry, []
        idle = not works and q.empty()
        if not works:
            first = q.get()
            if first is None:
                return [], True
            works = [first]
        spec = self.model.spec
        if not spec.batching:
            return works, False
        first, limit = works[0], spec.max_batch_size
        rows = sum(w.rows for w in works if w.key == first.key)
        deadline = time.perf_counter() + self.model.config.max_queue_delay_us * 1e-6 if idle else 0.0
        while rows < limit:
            try:
                w = q.get_nowait()
            except queue.Empty:
                wait = deadline - time.perf_counter()
                if wait <= 0:
                    break
                try:
                    w = q.get(timeout=wait)
                except queue.Empty:
                    break
            if w is None:
                return works, True
            works.append(w)
            if w.key == first.key:
                rows += w.rows
        return works, False

    def _groups(self, works: list[Work]) -> list[list[Work]]:
        spec = self.model.spec
        return groups_of(works, spec.max_batch_size) if spec.batching else [[w] for w in works]

    def _run(self, works: list[Work]) -> None:
        spec = self.model.spec
        t0 = time.perf_counter_ns()
        rows = sum(w.rows for w in works)
        batched = spec.batching and rows > 0
        size = bucket_of(rows, spec.buckets) if batched else rows
        try:
            staged = self._stage(works, size) if batched else None
            if staged is not None:
                feeds: dict[str, Any] = staged
            elif batched:
                feeds = {t.name: stack([w.feeds[t.name] for w in works], size) for t in spec.inputs}
            else:
                feeds = works[0].feeds
            t1 = time.perf_counter_ns()
            out = self.engine.run(feeds)      # every output: one plan per bucket, whatever was requested
            if staged is not None:            # torch in, torch out
                out = self._to_numpy(out, staged)
            t2 = time.perf_counter_ns()
            if batched and not self._splits(out, size):
                raise _Rerun()
            results = split(out, [w.rows for w in works]) if batched else [out]
        except _Rerun:
            for w in works:
                self._run([w])
            return
        except Exception as e:  # noqa: BLE001 - goes to the request(s), never kills the worker
            if len(works) > 1:                 # per-request errors stay per-request
                for w in works:
                    self._run([w])
                return
            self._finish([(works[0], None, e)])
            return
        t3 = time.perf_counter_ns()
        served = sum(max(w.rows, 1) for w in works)
        self.model.stats.executed(max(size, 1), served, [t0 - w.t_queued for w in works], t1 - t0, t2 - t1,
                                  t3 - t2)
        self._finish([(w, r if w.outputs is None else {k: r[k] for k in w.outputs}, None)
                      for w, r in zip(works, results)])
        if batched:                           # the whole call, copies and hand-off included: what a split adds
            self.costs.add(works[0].key, size, (time.perf_counter_ns() - t0) * 1e-9)

    def _stage(self, works: list[Work], size: int) -> dict[str, torch.Tensor] | None:
        """The group's inputs copied into this instance's staging buffers and padded to ``size`` rows with
        copies of the last row: {input name: the first ``size`` rows}. None when an input has a dtype
        without a torch twin (BYTES, bfloat16): those batches are concatenated in numpy."""
        key = works[0].key
        if key not in self._staging:
            if len(self._staging) >= STAGING_SHAPES:
                del self._staging[next(iter(self._staging))]
            self._staging[key] = self._new_staging(works[0])
        bufs = self._staging[key]
        if bufs is None:
            return None
        rows = sum(w.rows for w in works)
        for name, buf in bufs.items():
            # plain memcpy under the GIL, one request after another: no OpenMP team (torch.cat's threads
            # waited for cores that the gRPC front ends and clients held: 53 % of an H100 worker's time
            # for 14 ResNet-50 rows a call) and no GIL hand-back per request (np.concatenate lets it go
            # once per request and waits each time to get it back; docs/serve.md, Performance)
            dst = memoryview(buf.numpy()).cast("B")                      # [max_batch_size, ...] as bytes
            off = 0
            for w in works:
                a = w.feeds[name]
                src = memoryview(a if a.flags.c_contiguous else np.ascontiguousarray(a)).cast("B")
                dst[off:off + src.nbytes] = src
                off += src.nbytes
            row = off // rows
            for _ in range(size - rows):                                  # padding: the last row again
                dst[off:off + row] = dst[off - row:off]
                off += row
        return {name: buf[:size] for name, buf in bufs.items()}

    def _new_staging(self, w: Work) -> dict[str, torch.Tensor] | None:
        pin = self.engine.device.type == "cuda"
        bufs = {}
        for name, a in w.feeds.items():
            try:
                dtype = torch.from_numpy(np.empty(0, a.dtype)).dtype
            except TypeError:
                return None
            bufs[name] = torch.empty((self.model.spec.max_batch_size, *a.shape[1:]), dtype=dtype, pin_memory=pin)
        return bufs

    def _to_numpy(self, out: dict[str, Any], staged: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Outputs of a staged call as the numpy path gives them (declared dtypes restored); an output that
        shares memory with a staging buffer (an input passed through) is copied: the next batch
        overwrites the buffer while this one's responses are still being written."""
        ptrs = {b.untyped_storage().data_ptr() for b in staged.values()}
        vals = self.engine.graph.values
        res = {}
        for name, v in out.items():
            if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.untyped_storage().data_ptr() in ptrs:
                v = v.clone()
            res[name] = runtime_to_numpy(v, getattr(vals.get(name), "dtype", None))
        return res

    def _finish(self, done: list[Done]) -> None:
        now = time.perf_counter_ns()
        for ok in (True, False):
            ns = [now - w.t_queued for w, _, e in done if (e is None) == ok]
            if ns:
                self.model.stats.request_done(ok, sum(ns), len(ns))
        deliver(done)

    # ------------------------------------------------------------------ statistics
    def plan_stats(self) -> list[dict[str, Any]]:
        e = self.engine
        if e is None:
            return []
        out = []
        for r in e.runners():
            out.append({"instance": self.index, "name": r.name,
                        "signature": ["x".join(map(str, s)) if s is not None else "?" for s in r.key[1]],
                        "phase": r.phase.value, "calls": r.calls,
                        "replays": sum(s.replays for s in r.segments), "pinned": e.cache.is_pinned(r.key)})
        return out


class _Rerun(Exception):
    """The batched call's outputs cannot be split: run each request alone."""
