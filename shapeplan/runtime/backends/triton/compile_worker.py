"""A Triton compile worker: a separate process that compiles kernels into Triton's on-disk cache.

Run as a script (``python compile_worker.py SETTINGS``) by ``workers``; it imports Triton and
nothing of shapeplan or torch, so it is ready in the time of a Triton import. SETTINGS is one JSON
object from the parent, which read the switches (``shapeplan/env.py``): ``index``, ``stamp``, ``nice``,
``ctypes``, ``spawned`` and ``path`` (see ``main``); this process reads no ``SHAPEPLAN_*`` variable.
Protocol: one JSON object per line on stdin, one reply per line on stdout:

    job   {"id", "path", "name", "signature", "constexprs", "attrs", "target", "options", "src_hash", "launcher"}
    reply {"id", "ok": bool, "hash", "json", "launcher": bool, "seconds", "compile_s", "launcher_s", "error"}

``path``/``name`` locate the ``@triton.jit`` function (a module that imports only triton). The worker
rebuilds the same ``ASTSource``, refuses a job whose source hash differs from the parent's (the parent
would then miss the cache: its kernel is compiled in-process as without workers), and calls
``triton.compile``, which writes the result under ``TRITON_CACHE_DIR``, then builds the kernel's host
launcher (a C module Triton compiles per kernel signature on some versions), cached there too, unless
the job says the parent launches the kernel without one (``launch``). The reply
names the cache entry (``hash`` and its metadata file ``json``), which the parent loads. With a
``stamp`` in the settings, Triton's cache key is that stamp instead of a hash of Triton's library
(see ``workers``), so the worker is ready after the Triton import. Values are JSON with tuples and dicts tagged (``{"t": [...]}``,
``{"d": [[k, v], ...]}``) so the rebuilt source and options hash exactly as the parent's.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time


def decode(v):  # noqa: ANN001, ANN201 - JSON values
    if isinstance(v, list):
        return [decode(x) for x in v]
    if isinstance(v, dict):
        if "t" in v:
            return tuple(decode(x) for x in v["t"])
        return {decode(k): decode(x) for k, x in v["d"]}
    return v


_modules: dict = {}


def _function(path: str, name: str):  # noqa: ANN202
    mod = _modules.get(path)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"shapeplan_compile_worker_{len(_modules)}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        _modules[path] = mod
    return getattr(mod, name)


def _launcher(target, src, kernel) -> bool:  # noqa: ANN001
    """Build the kernel's host launcher too (Triton compiles a small C module per kernel signature with the
    system compiler on some versions, ~0.3-0.5 s, cached beside the kernel). CUDA only; best effort."""
    if getattr(target, "backend", "") != "cuda":
        return False
    try:
        from triton.backends.nvidia.driver import CudaLauncher, CudaUtils
        CudaUtils()                      # the driver's own helper module (built once per machine)
        CudaLauncher(src, kernel.metadata)
        return True
    except Exception:  # noqa: BLE001 - e.g. no libcuda here: the parent builds it at first launch
        return False


class _AnyMetadata:
    """Stands in for a kernel's metadata before it is compiled: every field reads as None."""

    def __getattr__(self, name: str):  # noqa: ANN204
        return None


def _launcher_early(target, src) -> None:  # noqa: ANN001
    """Start building the host launcher while the kernel compiles (its C source depends only on the
    signature and constants; the system compiler runs as a subprocess, outside the GIL). The build is
    cached by source, so ``_launcher`` after the compile finds it. Best effort: any failure here just
    leaves the build to ``_launcher``."""
    if getattr(target, "backend", "") != "cuda":
        return
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(src, _AnyMetadata())
    except Exception:  # noqa: BLE001, S110 - e.g. this Triton reads a field it needs: built after the compile
        pass


#: Triton's own ``triton_key`` while ``use_stamp`` has replaced it (None before)
tritons_key = None


def use_stamp(stamp: str) -> None:
    """Key this process's compiles by the installation stamp instead of Triton's hash of its own
    library (``triton_key``, computed once per process: 0.5-1.4 s). Without a stamp, Triton's key. The
    workers call it with the parent's stamp, and the parent itself when it imports Triton
    (``triton.env``), so a kernel any of them compiled is a cache hit for all (idempotent)."""
    global tritons_key
    import importlib
    if not stamp:
        return
    cache = importlib.import_module("triton.runtime.cache")
    original = getattr(cache, "triton_key", None)
    if original is None or getattr(original, "shapeplan_stamp", None) == stamp:
        return
    version = getattr(sys.modules.get("triton"), "__version__", "")
    key = f"{version}-shapeplan-stamp-{stamp}"

    def stamped() -> str:
        return key
    stamped.shapeplan_stamp = stamp                   # type: ignore[attr-defined]
    for name, mod in list(sys.modules.items()):       # every module that imported it by name
        if name.startswith("triton") and getattr(mod, "triton_key", None) is original:
            mod.triton_key = stamped
    if tritons_key is None:
        tritons_key = original


def _lower_priority(n: int) -> None:
    """Run below the parent (``SHAPEPLAN_TRITON_WORKER_NICE``, default 10; 0 keeps the parent's): while
    the workers import Triton the parent is still optimizing and compiling the plan, the work every
    kernel waits for. (The parent also caps its torch threads meanwhile: ``runtime/compile.py``.)"""
    try:
        if n > 0:
            os.nice(n)
    except OSError:
        pass


def _builds_launchers() -> bool:
    """Whether this Triton builds a C launcher per kernel signature (then the parent's ``launch``
    replaces its helper modules)."""
    try:
        import triton.backends.nvidia.driver as nvd
        return hasattr(nvd, "make_launcher")
    except Exception:  # noqa: BLE001
        return False


def main() -> None:
    # the parent's settings (workers._Worker); run by hand without them, the defaults below
    settings = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    _lower_priority(int(settings.get("nice", 10)))
    here = os.path.dirname(os.path.abspath(__file__))
    extra = [p for p in settings.get("path", []) if p]
    sys.path[:] = [p for p in sys.path + [p for p in extra if p not in sys.path]
                   if os.path.abspath(p or ".") != here]                    # no shadowing by our modules
    try:
        import triton
    except ImportError:
        if sys.flags.no_site:            # started with -S and Triton needs site initialisation: once more with it
            os.execv(sys.executable, [sys.executable, "-u", os.path.abspath(__file__), *sys.argv[1:]])
        raise
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    use_stamp(settings.get("stamp", ""))
    ctypes_launch = bool(settings.get("ctypes", True))
    if settings.get("index") == 0 and not (ctypes_launch and _builds_launchers()):
        try:      # the CUDA driver's helper module (a C build on a cold cache): one worker builds it up front
                  # unless the parent loads and launches through ctypes (launch.py) and never needs it
            from triton.backends.nvidia.driver import CudaUtils
            CudaUtils()
        except Exception:  # noqa: BLE001, S110 - no CUDA here: the parent builds it when it needs it
            pass
    out = sys.stdout
    spawned = settings.get("spawned")          # seconds from the parent's spawn to ready (start-up diagnostics)
    ready_s = round(time.time() - float(spawned), 3) if spawned is not None else None
    out.write(json.dumps({"ready": True, "pid": os.getpid(), "triton": triton.__version__, "ready_s": ready_s,
                          "site": not sys.flags.no_site}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        t0 = time.perf_counter()
        job = json.loads(line)
        reply = {"id": job.get("id"), "ok": False, "error": ""}
        try:
            fn = _function(job["path"], job["name"])
            src = ASTSource(fn, decode(job["signature"]), decode(job["constexprs"]), decode(job["attrs"]))
            if src.hash() != job["src_hash"]:
                reply["error"] = "source hash differs from the parent's"
            else:
                target = GPUTarget(*decode(job["target"]))
                build = job.get("launcher", True)       # False: the parent launches it without one
                early = threading.Thread(target=_launcher_early, args=(target, src), daemon=True)
                if build:
                    early.start()
                kernel = triton.compile(src, target=target, options=decode(job["options"]))
                t1 = time.perf_counter()
                if build:
                    early.join()
                reply["ok"] = True
                reply["hash"] = kernel.hash
                reply["json"] = next((n for n in kernel.metadata_group if n.endswith(".json")
                                      and not n.startswith("__grp__")), "")
                reply["launcher"] = _launcher(target, src, kernel) if build else False
                # start-up diagnostics: the kernel's compile, then the wait for its host launcher's build
                reply["compile_s"] = round(t1 - t0, 4)
                reply["launcher_s"] = round(time.perf_counter() - t1, 4)
        except Exception as e:  # noqa: BLE001 - reported to the parent, which compiles in-process
            reply["error"] = f"{type(e).__name__}: {e}"[:500]
        reply["seconds"] = round(time.perf_counter() - t0, 4)
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
