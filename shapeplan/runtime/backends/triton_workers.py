"""Compile Triton kernels in worker processes, so a cold start compiles them side by side.

Triton compiles a kernel in ~0.3-0.5 s and holds the GIL for most of it, so threads overlap little.
``install`` (called by ``triton_env`` once Triton is imported) wraps ``triton.compile``: a compile that
the manifest does not list is first sent to one of N worker processes (``triton_compile_worker``: a
Triton import and nothing else), which compiles it into Triton's disk cache; the wrapper then calls
Triton's own compile, which finds the kernel there. While it waits, the calling thread holds no GIL, so
the warm-up threads of ``triton_backend.warm_kernels`` compile in parallel for real.

Nothing depends on a worker for correctness: a job a worker cannot take (a value it cannot encode, a
source that hashes differently there, a crash) leaves Triton's compile to do the work in-process, as
without workers (a FALLBACK event says why). The manifest (``<Triton cache>/shapeplan_compiled.txt``,
one key per compiled source/target/options) lets a warm start skip the workers entirely: a listed
kernel goes straight to Triton's compile, a cache hit.

``SHAPEPLAN_TRITON_WORKERS``: number of workers (default min(8, CPUs - 1)); 0 turns this off.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from shapeplan import diagnostics

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_compile_worker.py")

_lock = threading.Lock()
_original: Any = None
_pool: "_Pool | None" = None
_inflight: dict[str, threading.Event] = {}


def worker_count() -> int:
    default = max(1, min(8, (os.cpu_count() or 2) - 1))
    env = os.environ.get("SHAPEPLAN_TRITON_WORKERS", "").strip()
    if not env:
        return default
    try:
        return max(0, int(env))
    except ValueError:
        diagnostics.record("FALLBACK", "SHAPEPLAN_TRITON_WORKERS is not a whole number: using the default",
                           given=env, default=default)
        return default


def manifest_path() -> str:
    from shapeplan.runtime.backends.triton_paths import triton_cache_dir
    return str(triton_cache_dir() / "shapeplan_compiled.txt")


# ---- the wrapper around triton.compile ---------------------------------------------------------------------

def install() -> None:
    """Wrap Triton's compile (idempotent). Called once Triton is imported."""
    global _original
    import triton
    import triton.compiler as tc
    with _lock:
        if _original is not None:
            return
        _original = tc.compile
        for mod in (tc, triton, sys.modules.get("triton.runtime.jit")):
            if mod is not None and getattr(mod, "compile", None) is _original:
                mod.compile = compile_kernel


def compile_kernel(src: Any, target: Any = None, options: Any = None, *args: Any, **kw: Any) -> Any:
    """Triton's ``compile``, with the compile itself done in a worker when the kernel is new."""
    orig = _original
    if worker_count() == 0 or target is None or not hasattr(src, "fn") or args:
        return orig(src, target, options, *args, **kw)
    try:
        key = _key(src, target, options)
        job = _job(src, target, options)
    except Exception:  # noqa: BLE001 - not encodable: Triton compiles it here
        return orig(src, target, options, *args, **kw)
    with _lock:
        busy = _inflight.get(key)
        if busy is None and key not in _known():
            _inflight[key] = mine = threading.Event()
        else:
            mine = None
    if busy is not None:                     # another thread has sent this very kernel: wait for it
        busy.wait()
    elif mine is not None:
        try:
            reply = _get_pool().submit(job)
        finally:
            with _lock:
                _inflight.pop(key, None)
            mine.set()
        name = getattr(src, "name", "?")
        if reply is not None and reply.get("ok"):
            diagnostics.record("COMPILE", "Triton kernel compiled in a worker process", kernel=name,
                               seconds=reply.get("seconds"))
        else:
            diagnostics.record("FALLBACK", "Triton kernel compiled in-process (worker declined)", kernel=name,
                               reason=(reply or {}).get("error", "no worker"))
    res = orig(src, target, options, *args, **kw)
    _remember(key)
    return res


def compute_triton_key() -> None:
    """Triton's cache key (cached by Triton per process): computed once, ahead of the first compile."""
    import importlib
    done = set()
    for mod in ("triton.compiler.compiler", "triton.runtime.cache"):      # where Triton versions keep it
        try:
            fn = getattr(importlib.import_module(mod), "triton_key", None)
        except ImportError:
            continue
        if fn is not None and id(fn) not in done:
            done.add(id(fn))
            fn()


def prestart_if_cold() -> None:
    """Start the workers now when this cache has compiled nothing yet (a cold start will need them)."""
    if worker_count() and not _known():
        _get_pool()


# ---- keys, jobs and the manifest ------------------------------------------------------------------------

def _enc(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {"t": [_enc(x) for x in v]}
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, dict):
        return {"d": [[_enc(k), _enc(x)] for k, x in v.items()]}
    raise TypeError(f"cannot send a {type(v).__name__} to a compile worker")


def _job(src: Any, target: Any, options: Any) -> dict[str, Any]:
    fn = src.fn
    pyfn = getattr(fn, "fn", None)
    path = getattr(getattr(pyfn, "__code__", None), "co_filename", None)
    if not path or not os.path.exists(path):
        raise TypeError("kernel has no source file")
    return {"path": path, "name": pyfn.__name__, "signature": _enc(dict(src.signature)),
            "constexprs": _enc(dict(src.constants)), "attrs": _enc(dict(src.attrs)),
            "target": _enc((target.backend, target.arch, target.warp_size)),
            "options": _enc(dict(options or {})), "src_hash": src.hash()}


def _key(src: Any, target: Any, options: Any) -> str:
    import triton
    opts = json.dumps(_enc(dict(options or {})), sort_keys=True)
    text = f"{triton.__version__}|{src.hash()}|{target.backend}|{target.arch}|{target.warp_size}|{opts}"
    return hashlib.sha256(text.encode()).hexdigest()


def _known() -> set[str]:
    from shapeplan.runtime.backends.triton_paths import keys_in
    return keys_in(manifest_path())


def _remember(key: str) -> None:
    from shapeplan.runtime.backends.triton_paths import add_key
    add_key(manifest_path(), key)


# ---- the worker pool -------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, index: int = 0) -> None:
        env = dict(os.environ, SHAPEPLAN_WORKER_INDEX=str(index))
        from shapeplan.runtime.backends.triton_paths import triton_cache_dir
        env.setdefault("TRITON_CACHE_DIR", str(triton_cache_dir()))
        self.proc = subprocess.Popen([sys.executable, "-u", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.seq = 0

    def call(self, job: dict[str, Any]) -> dict[str, Any]:
        self.seq += 1
        job = dict(job, id=self.seq)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"compile worker exited (code {self.proc.poll()})")
            msg = json.loads(line)
            if msg.get("id") == self.seq:
                return msg

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass


class _Pool:
    def __init__(self, n: int) -> None:
        self.idle: queue.Queue[_Worker | None] = queue.Queue()
        self.all: list[_Worker] = []
        self.alive = 0
        for i in range(n):
            try:
                w = _Worker(i)
            except OSError:
                continue
            self.all.append(w)
            self.idle.put(w)
            self.alive += 1
        self.started = time.perf_counter()
        diagnostics.record("COMPILE", "Triton compile workers started", workers=self.alive)

    def submit(self, job: dict[str, Any]) -> dict[str, Any] | None:
        if not self.alive:
            return None
        w = self.idle.get()
        if w is None:                              # every worker has died: nothing left to wait for
            self.idle.put(None)
            return None
        try:
            reply = w.call(job)
        except Exception as e:  # noqa: BLE001 - a dead worker leaves the pool
            w.close()
            with _lock:
                self.alive -= 1
                if not self.alive:
                    self.idle.put(None)
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        self.idle.put(w)
        return reply

    def close(self) -> None:
        for w in self.all:
            w.close()


def _get_pool() -> _Pool:
    global _pool
    with _lock:
        if _pool is None:
            _pool = _Pool(worker_count())
            atexit.register(_pool.close)
        return _pool


def shutdown() -> None:
    """Stop the workers (they also stop with this process)."""
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None
