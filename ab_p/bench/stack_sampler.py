"""Sample one thread's Python stack every millisecond (start-up probes: where the main thread spends a
window of wall time, including time it waits for the GIL or the CUDA driver).

    s = StackSampler(); s.start(); ...; s.stop()
    print(s.report(t_from, t_to, top=25))      # perf_counter window

Each sample is weighted by the wall time since the previous one, so a stretch in which the sampler could
not run (the sampled thread held the GIL in C code) is charged to the stack found after it. ``leaf``
rows: the innermost frame of shapeplan, Triton or torch's Python code (file:line function); ``incl``
rows: every function on the stack (inclusive time). A probe, not a profiler of record.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

_KEEP = ("shapeplan", "triton", "torch", "bench")


def _short(fn: str) -> str:
    for k in _KEEP:
        i = fn.rfind(os.sep + k + os.sep)
        if i >= 0:
            return fn[i + 1:]
    return os.path.basename(fn)


class StackSampler:
    def __init__(self, thread_id: int | None = None, interval: float = 0.001) -> None:
        self.tid = thread_id if thread_id is not None else threading.main_thread().ident
        self.interval = interval
        self.samples: list[tuple[float, float, tuple]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="stack-sampler", daemon=True)

    def start(self) -> "StackSampler":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def _loop(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(self.interval)
            now = time.perf_counter()
            f = sys._current_frames().get(self.tid)
            stack = []
            while f is not None and len(stack) < 60:
                co = f.f_code
                stack.append((_short(co.co_filename), f.f_lineno, co.co_name))
                f = f.f_back
            self.samples.append((now, now - last, tuple(stack)))
            last = now

    def report(self, t_from: float, t_to: float, top: int = 25) -> str:
        leaf: collections.Counter = collections.Counter()
        incl: collections.Counter = collections.Counter()
        runs: collections.Counter = collections.Counter()      # separate visits to a leaf
        prev = None
        total = 0.0
        for t, dt, stack in self.samples:
            if not t_from <= t <= t_to:
                continue
            total += dt
            mine = [s for s in stack if s[0].startswith(_KEEP)]
            top_ = mine[0] if mine else (stack[0] if stack else ("?", 0, "?"))
            name = f"{top_[0]}:{top_[1]} {top_[2]}"
            leaf[name] += dt
            if name != prev:
                runs[name] += 1
            prev = name
            for fn in {f"{s[0]} {s[2]}" for s in stack}:
                incl[fn] += dt
        out = [f"  window {1000 * total:.1f} ms sampled"]
        out += [f"  leaf {1000 * v:7.1f} ms  {runs[k]:4d} visits  {k}" for k, v in leaf.most_common(top)]
        out += [f"  incl {1000 * v:7.1f} ms  {k}" for k, v in incl.most_common(top)]
        return "\n".join(out)
