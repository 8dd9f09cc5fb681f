"""Compile Triton kernels in worker processes, and load compiled ones without Triton's cache key.

Triton compiles a kernel in ~0.3-0.5 s and holds the GIL for most of it, so threads overlap little.
``install`` (called by ``env.patch()`` when a triton-mode engine is created) wraps ``triton.compile``:
a compile that the manifest does not list is sent to one of N worker processes (``compile_worker.py``:
a Triton import and nothing else), which compiles it into Triton's disk cache and answers with the kernel's
cache entry; the wrapper loads that entry. While it waits, the calling thread holds no GIL, so the
warm-up threads of ``warmup.warm_kernels`` compile in parallel for real.

The manifest (``<Triton cache>/shapeplan_compiled.txt``) maps our key of a kernel (source hash, target,
options, cache-relevant environment, and the installation *stamp*) to its entry in Triton's cache, so a
warm start loads every kernel straight from there (``CompiledKernel``), as Triton's compile does on a
cache hit, without computing Triton's own cache key. That key hashes Triton's whole library (~500 MB:
0.3-1 s per process, the largest single item of a warm start on the H200). The stamp stands in for it
the way Python's ``.pyc`` check does: version, size and modification time of every Python file, shared
library and tool of the Triton installation; reinstalling Triton changes it. Workers compile under the
stamp too (Triton's warm-up pool does the same with its own key), so they are ready after a Triton
import.

Nothing depends on a worker for correctness: a job a worker cannot take (a value it cannot encode, a
source that hashes differently there, a crash) and an entry that no longer loads leave Triton's own
compile to do the work in-process, as without workers (a FALLBACK event says why).

``SHAPEPLAN_TRITON_WORKERS``: number of workers (default min(8, CPUs - 1)); 0 turns this off. A worker gets
its settings (index, stamp, priority, launcher choice, import path) as one JSON argument.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from shapeplan import diagnostics, env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")

_lock = threading.Lock()
_original: Any = None
_pool: "_Pool | None" = None
_inflight: dict[str, threading.Event] = {}
_t_pool = 0.0                                  # perf_counter when the pool was started (diagnostics)


def worker_count() -> int:
    """``SHAPEPLAN_TRITON_WORKERS``, default min(8, CPUs - 1); 0 turns the workers off."""
    n = env.get("SHAPEPLAN_TRITON_WORKERS")
    return max(1, min(8, (os.cpu_count() or 2) - 1)) if n is None else max(0, n)


def manifest_path() -> str:
    from shapeplan.runtime.backends.triton.paths import triton_cache_dir
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
    """Triton's ``compile``: a kernel the manifest lists is loaded from its cache entry; a new one is
    compiled in a worker (or, failing that, by Triton in-process) and entered in the manifest."""
    orig = _original
    if target is None or not hasattr(src, "fn") or args or set(kw) - {"_env_vars"} or _triton_decides():
        return orig(src, target, options, *args, **kw)
    try:
        key = _key(src, target, options, kw.get("_env_vars"))
    except Exception:  # noqa: BLE001 - not encodable: Triton compiles it here
        return orig(src, target, options, *args, **kw)
    res = _load(key, src)
    if res is None and worker_count():
        _compile_in_worker(key, src, target, options)
        res = _load(key, src)
    if res is not None:
        return res
    res = orig(src, target, options, *args, **kw)
    group = getattr(res, "metadata_group", None) or {}
    json_name = next((n for n in group if n.endswith(".json") and not n.startswith("__grp__")), "")
    if getattr(res, "hash", None) and json_name:
        _remember(key, res.hash, json_name)
    return res


def _compile_in_worker(key: str, src: Any, target: Any, options: Any) -> None:
    """Have a worker compile this kernel and enter its cache entry in the manifest; a thread asking for a
    kernel another thread has already sent waits for that one instead. Failures are recorded only."""
    with _lock:
        busy = _inflight.get(key)
        if busy is None:
            _inflight[key] = mine = threading.Event()
    if busy is not None:
        busy.wait()
        return
    sent = time.perf_counter()
    try:
        reply = _get_pool().submit(_job(src, target, options))
        if reply is not None and reply.get("ok") and reply.get("hash"):
            _remember(key, reply["hash"], reply.get("json", ""))
    except Exception as e:  # noqa: BLE001 - e.g. a source file we cannot name: compiled here
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        with _lock:
            _inflight.pop(key, None)
        mine.set()
    name = getattr(src, "name", "?")
    if reply is not None and reply.get("ok"):
        diagnostics.record("COMPILE", "Triton kernel compiled in a worker process", kernel=name,
                           seconds=reply.get("seconds"), compile_s=reply.get("compile_s"),
                           launcher_s=reply.get("launcher_s"), sent_at_s=round(sent - _t_pool, 4))
    else:
        diagnostics.record("FALLBACK", "Triton kernel compiled in-process (worker declined)", kernel=name,
                           reason=(reply or {}).get("error", "no worker"))


def _triton_decides() -> bool:
    """Settings under which Triton's own compile must run: always-compile, or a stages hook that
    changes its cache key."""
    try:
        import triton
        knobs = triton.knobs
        return bool(knobs.compilation.always_compile) or knobs.runtime.add_stages_inspection_hook is not None
    except AttributeError:
        return False


_IR_TEXT = (".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn")


def _load(key: str, src: Any) -> Any:
    """The compiled kernel of a manifest entry, loaded from Triton's cache as Triton does on a hit; None
    when the manifest does not list it or its files are gone (then it is compiled again)."""
    entry = _known().get(key)
    if not entry:
        return None
    kernel_hash, _, json_name = entry.partition(" ")
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.cache import get_cache_manager
        group = get_cache_manager(kernel_hash).get_group(json_name)
        if not group or json_name not in group:
            return None
        # only the metadata and the binary: Triton would also read every IR text (ttir ... ptx, often MBs)
        group = {n: p for n, p in group.items() if not n.endswith(_IR_TEXT)}
        return CompiledKernel(src, group, kernel_hash)
    except Exception as e:  # noqa: BLE001 - e.g. a damaged entry: Triton compiles it again
        diagnostics.record("FALLBACK", "Triton cache entry did not load: compiling again",
                           kernel=getattr(src, "name", "?"), reason=f"{type(e).__name__}: {e}"[:300])
        return None


def triton_dir() -> str | None:
    """Triton's package directory, found without importing Triton."""
    spec = importlib.util.find_spec("triton")
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    return locs[0] if locs else None


_stamp_lock = threading.Lock()


def stamp() -> str:
    """The installation stamp (computed once per process; threads asking together wait for one)."""
    with _stamp_lock:
        return _stamp()


stamp.cache_clear = lambda: _stamp.cache_clear()   # type: ignore[attr-defined]  (tests: a new installation)


@functools.cache
def _stamp() -> str:
    """The installation stamp that stands in for Triton's cache key: Triton's version and the size and
    modification time of each of its Python files, shared libraries and bundled tools (ptxas ...)."""
    from shapeplan.cache.fingerprint import tree_stamp
    t0 = time.perf_counter()
    root = triton_dir()
    version, digest, counted = "", hashlib.sha256().hexdigest(), 0
    if root:
        try:
            with open(os.path.join(root, "__init__.py"), encoding="utf-8") as f:
                version = next((ln for ln in f if ln.startswith("__version__")), "")
        except OSError:
            pass
        digest, counted = tree_stamp(root, lambda d, name: name.endswith((".py", ".so")) or os.path.basename(d) == "bin",
                                     skip_dirs=("include", "__pycache__"))              # not headers, bytecode
    diagnostics.record("COMPILE", "Triton installation stamp computed", files=counted,
                       seconds=round(time.perf_counter() - t0, 4))
    return f"{version.strip()}|{root}|{digest}"


def _env() -> dict[str, str]:
    """The environment a kernel's compile depends on: Triton's cache-invalidating variables (when this
    Triton reports them) plus every TRITON_* variable but the cache locations."""
    out: dict[str, str] = {}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
        out.update({str(k): str(v) for k, v in get_cache_invalidating_env_vars().items()})
    except Exception:  # noqa: BLE001, S110 - older Triton: the TRITON_* variables below cover it
        pass
    out.update({k: v for k, v in os.environ.items() if k.startswith("TRITON_")
                and k not in ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR")})
    return out


def prestart_if_cold() -> None:
    """Start the workers now when this cache has compiled nothing yet (a cold start will need them)."""
    if worker_count() and not _known() and triton_dir() is not None:
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
    from shapeplan.runtime.backends.triton import launch
    return {"path": path, "name": pyfn.__name__, "signature": _enc(dict(src.signature)),
            "constexprs": _enc(dict(src.constants)), "attrs": _enc(dict(src.attrs)),
            "target": _enc((target.backend, target.arch, target.warp_size)),
            "options": _enc(dict(options or {})), "src_hash": src.hash(),
            "launcher": not launch.launches(src)}      # launched through ctypes: no host launcher


def _key(src: Any, target: Any, options: Any, env_vars: Any = None) -> str:
    opts = json.dumps(_enc(dict(options or {})), sort_keys=True)
    env = json.dumps(sorted({**_env(), **{str(k): str(v) for k, v in dict(env_vars or {}).items()}}.items()))
    text = f"{stamp()}|{src.hash()}|{target.backend}|{target.arch}|{target.warp_size}|{opts}|{env}"
    return hashlib.sha256(text.encode()).hexdigest()


def _known() -> dict[str, str]:
    from shapeplan.runtime.backends.triton.paths import keys_in
    return keys_in(manifest_path())


def _remember(key: str, kernel_hash: str, json_name: str) -> None:
    from shapeplan.runtime.backends.triton.paths import add_key
    add_key(manifest_path(), key, f"{kernel_hash} {json_name}")


# ---- the worker pool -------------------------------------------------------------------------------------

class _Worker:
    def __init__(self, index: int = 0) -> None:
        from shapeplan.runtime.backends.triton.paths import triton_cache_dir
        environ = dict(os.environ)
        environ.setdefault("TRITON_CACHE_DIR", str(triton_cache_dir()))
        # the worker imports nothing of shapeplan: it gets its settings on the command line (compile_worker.main)
        # -S: no site initialisation (0.3 s in some environments); the worker gets this process's import
        # path instead, and restarts itself with site initialisation when Triton does not import so
        settings = {"index": index, "stamp": stamp(), "nice": env.get("SHAPEPLAN_TRITON_WORKER_NICE"),
                    "ctypes": env.get("SHAPEPLAN_TRITON_CTYPES"), "spawned": time.time(),
                    "path": [p for p in sys.path if p and os.path.isdir(p)]}
        self.proc = subprocess.Popen([sys.executable, "-S", "-u", WORKER, json.dumps(settings)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=environ)
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
    """Workers join the idle queue when they report ready (a watcher thread per worker reads that
    line), so a job goes to the first worker that can take it, not to one still importing Triton."""

    def __init__(self, n: int) -> None:
        self.idle: queue.Queue[_Worker | None] = queue.Queue()
        self.all: list[_Worker] = []
        self.alive = 0
        self.ready: set[int] = set()               # pids of the live workers that reported ready
        spawn_s = []
        for i in range(n):
            t = time.perf_counter()
            try:
                w = _Worker(i)
            except OSError:
                continue
            spawn_s.append(round(time.perf_counter() - t, 4))
            self.all.append(w)
            self.alive += 1
        for w in self.all:
            threading.Thread(target=self._await_ready, args=(w,), daemon=True,
                             name="shapeplan-compile-worker-ready").start()
        diagnostics.record("COMPILE", "Triton compile workers started", workers=self.alive, spawn_s=spawn_s)

    def _await_ready(self, w: _Worker) -> None:
        try:
            assert w.proc.stdout is not None
            msg = json.loads(w.proc.stdout.readline() or "{}")
        except (OSError, ValueError):
            msg = {}
        if msg.get("ready"):
            diagnostics.record("COMPILE", "Triton compile worker ready", seconds=msg.get("ready_s"),
                               site=msg.get("site"))
            with _lock:
                self.ready.add(w.proc.pid)
            self.idle.put(w)
        else:                                      # died while starting
            self._lost(w)

    def _lost(self, w: _Worker) -> None:
        w.close()
        with _lock:
            self.alive -= 1
            self.ready.discard(w.proc.pid)
            if not self.alive:
                self.idle.put(None)

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
            self._lost(w)
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        self.idle.put(w)
        return reply

    def close(self) -> None:
        for w in self.all:
            w.close()


def starting() -> int:
    """How many workers are still starting (importing Triton, each keeping one core busy)."""
    pool = _pool
    if pool is None:
        return 0
    with _lock:
        return pool.alive - len(pool.ready)


def _get_pool() -> _Pool:
    global _pool, _t_pool
    with _lock:
        if _pool is None:
            _t_pool = time.perf_counter()
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
