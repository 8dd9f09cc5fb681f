"""``sp.compile``: load -> (disk cache | verify + optimize + compile_plan) -> Engine.

Disk cache use: ``disk_cache=True/False``; default (None) reads ``SHAPEPLAN_DISK_CACHE``
(``1`` on, ``0`` off, unset: on for models given as a file path, off for in-memory graphs, whose
hashing would cost a serialization).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from shapeplan import diagnostics, env


def _model_hash(model: Any, graph: Any) -> str:
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        h = hashlib.sha256()
        with open(model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "file:" + h.hexdigest()
    from shapeplan.plan.serialize import graph_to_bytes
    return "graph:" + hashlib.sha256(graph_to_bytes(graph)).hexdigest()


def _prestart_compile_workers(device: Any, mode: Any) -> None:
    """Start-up: a CUDA engine that may run Triton kernels starts Triton's compile workers now (on a
    cold cache), while the model is loaded and optimized, rather than when the Engine is created.
    Only the worker processes: this process's own Triton import stays at Engine creation (on the H200,
    importing it here competed with the optimizer for the GIL and delayed the first kernels by ~0.25 s)."""
    try:
        import torch

        from shapeplan.runtime.modes import Mode
        if torch.device(device).type != "cuda" or Mode.parse(mode) not in (Mode.AUTO, Mode.TRITON):
            return
        from shapeplan.runtime.backends.triton import warmup, workers
        if warmup._warm_on() and torch.cuda.is_available():
            workers.prestart_if_cold()
    except Exception:  # noqa: BLE001, S110 - an optimisation only: the Engine prepares as before
        pass


_cap_lock = threading.Lock()
_cap_users = 0
_cap_restore = 0           # torch's thread count before the first of the overlapping compiles capped it


@contextlib.contextmanager
def _cores_left_to_workers() -> Iterator[None]:
    """While Triton compile workers start (each keeps a core busy importing Triton), run this process's
    CPU kernels on half the cores they leave, and restore torch's thread count afterwards. The
    optimizer's CPU work (weight concatenation, constant folding) runs on torch's intra-op pool, and an
    OpenMP region waits for its slowest thread: with a thread per core and eight cores taken by
    workers, the block stack's optimize took 0.31 s instead of 0.05 s on the H200's 16 cores.
    Overlapping compiles on several threads share one cap; the last one out restores the count."""
    global _cap_users, _cap_restore
    busy = 0
    try:
        from shapeplan.runtime.backends.triton import workers
        busy = workers.starting()
    except Exception:  # noqa: BLE001, S110 - no Triton here: no workers
        pass
    if not busy:
        yield
        return
    import torch
    with _cap_lock:
        before = _cap_restore if _cap_users else torch.get_num_threads()
        cap = max(1, ((os.cpu_count() or 1) - busy) // 2)
        if cap < before:
            _cap_restore, _cap_users = before, _cap_users + 1
            torch.set_num_threads(min(cap, torch.get_num_threads()))
    if cap >= before:
        yield
        return
    diagnostics.record("COMPILE", "CPU threads capped while compile workers start", threads=cap, was=before,
                       workers_starting=busy)
    try:
        yield
    finally:
        with _cap_lock:
            _cap_users -= 1
            if not _cap_users:
                torch.set_num_threads(_cap_restore)


def compile_model(model: Any, device: str = "cpu", mode: Any = "auto", *, optimize: bool = True,
                  skip: list[str] | None = None, disk_cache: bool | None = None, cache_dir: str | None = None,
                  force_recompile: bool | None = None, outputs: Any = None, **kw: Any) -> Any:
    """``outputs``: the output names whose plan is compiled now (default: all of them), as
    ``engine.run(..., outputs=...)`` will request them; other output sets compile at their first run.
    Any error compiling it is raised here. The disk cache always stores the all-outputs plan."""
    from shapeplan.importers import load
    from shapeplan.runtime.engine import Engine
    t0 = time.perf_counter()
    _prestart_compile_workers(device, mode)
    with _cores_left_to_workers():
        graph = load(model)
        if disk_cache is None:
            disk_cache = env.get("SHAPEPLAN_DISK_CACHE")
            if disk_cache is None:                       # unset: on for model files
                disk_cache = isinstance(model, (str, os.PathLike))
        disk = key = fp = None
        if disk_cache:
            from shapeplan.cache.disk import DiskCache
            from shapeplan.cache.fingerprint import cache_key, fingerprint
            disk = DiskCache(cache_dir, force_recompile=force_recompile)
            fp = fingerprint(str(device))
            key = cache_key(_model_hash(model, graph), {"optimize": optimize, "skip": sorted(skip or [])}, fp)
            plan = disk.get(key, fp)
            if plan is not None:
                engine = Engine(plan.graph, device=device, mode=mode, **kw)
                engine._plans[None] = plan
                engine.compile_info = {"source": "disk", "seconds": time.perf_counter() - t0, "key": key}
                diagnostics.record("COMPILE", "warm start from disk cache", key=key,
                                   seconds=engine.compile_info["seconds"])
                return engine
        graph.verify()
        if optimize:
            from shapeplan.optimize import optimize as _optimize
            graph = _optimize(graph, skip=skip)
            diagnostics.record("COMPILE", "graph optimized", nodes=len(graph.nodes))
        engine = Engine(graph, device=device, mode=mode, **kw)
        diagnostics.record("COMPILE", "engine created")
        if disk is not None and key is not None:
            disk.put(key, engine.plan(None), fp, {"graph": graph.name, "nodes": len(graph.nodes)})
        engine.plan(list(outputs) if outputs is not None else None)
        engine.compile_info = {"source": "compiled", "seconds": time.perf_counter() - t0, "key": key}
        return engine
