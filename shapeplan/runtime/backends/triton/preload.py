"""The Triton kernels of a pipeline's start-up, loaded again by the warm-up threads at the next start.

In a warm start the decode plan's eager run before its capture took 60 ms on an H100 (forty-fifth session,
docs/benchmarks/decode.md), and the prefill plan's 26 ms: both plans are op kernels run as slots, so the
capture-first path of fused steps never applied, and the eager run is where each of their Triton kernels
was launched for the first time in the process: Triton's binder, its cache lookup, the compiled kernel read
from disk, its module loaded into the GPU. None of that needs the plan's tensors. With
``SHAPEPLAN_TRITON_PRELOAD``:

- *record*: from a pipeline's construction until its first decode call returns, each of shapeplan's
  kernels that Triton compiles or takes from its disk cache in this process is recorded as Triton's own
  specialization data (``serialize_specialization_data``: signature, constants, attributes, options and the
  launch's key; what ``JITFunction.preload`` takes), in ``<Triton cache>/shapeplan_preload.json``, under
  the stamp of ``jit_keys`` (the package's sources and Triton's installation: another version of either
  starts afresh) and under the start-up's *context* (the pipeline's model configuration, dtype, KV cache
  and mode: a start preloads only the kernels of a start like itself; the last ``MAX_CONTEXTS`` are kept);
- *preload*: at the next start the warm-up threads give each record to ``JITFunction.preload`` (the cache
  lookup and the disk read) and load the kernel into the GPU (``CompiledKernel._init_handles``: the module
  load runs without the GIL through ``launch.Utils``), before any capture (a capture waits for them);
- *capture first*: a segment without fused steps is captured before any eager run, and one replay gives the
  call's results (``TritonBackend._capture_first``), when its kernels were all loaded: preloaded, or run
  by the segment's warm-up in this process.

A kernel that is not loaded when a capture reaches it stops that capture before any driver call
(``guard_loads``: ``KernelNotLoaded``; loading a module is not permitted while a stream captures, and the
driver's error would invalidate the capture), and the segment runs eagerly first as before. So a missing or
stale record costs one abandoned capture, never a wrong result. Off by default until timed on a GPU.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import threading
from typing import Any

from shapeplan import diagnostics, env

VERSION = 2
#: most records kept per context (the first ones a start-up compiled come first), and most contexts kept
MAX_RECORDS = 256
MAX_CONTEXTS = 16
_DO_COMPILE_PARAMS = ["self", "key", "signature", "device", "constexprs", "options", "attrs", "warmup"]
_SERIALIZE_PARAMS = ["name", "signature", "constants", "attrs", "options", "key"]

_lock = threading.Lock()
_original: Any = None                      # JITFunction._do_compile while ours is in place
_serialize_target = False                  # whether Triton's serialize_specialization_data takes the target
_recording = False
_context = ""                              # the start-up being recorded
_new: list[list] = []                      # [module, qualname, data] recorded in this process, in order
_file: dict[str, list[list]] | None = None   # the records read (this stamp's), by context, once a process
_preloaded = threading.Event()             # set when a preload of this process has finished
counts = {"recorded": 0, "preloaded": 0, "present": 0, "failed": 0}


class KernelNotLoaded(RuntimeError):
    """A Triton kernel reached its first launch inside a CUDA graph capture (``guard_loads``)."""


def enabled() -> bool:
    from shapeplan.runtime.backends.triton.env import interpreting
    return bool(env.get("SHAPEPLAN_TRITON_PRELOAD")) and not interpreting()


def path() -> str:
    from shapeplan.runtime.backends.triton.paths import triton_cache_dir
    return str(triton_cache_dir() / "shapeplan_preload.json")


def _stamp() -> str:
    from shapeplan.runtime.backends.triton import jit_keys
    return f"v{VERSION}|{jit_keys.stamp()}"


def _package_kernel(fn: Any) -> bool:
    from shapeplan.runtime.backends.triton import jit_keys
    return jit_keys.package_file(getattr(fn, "fn", None)) is not None


def _params(f: Any) -> list[str]:
    """The parameter names of ``f`` ([] when it is missing or has no readable signature)."""
    try:
        return list(inspect.signature(f).parameters) if f is not None else []
    except (TypeError, ValueError):
        return []


# ---- record ---------------------------------------------------------------------------------------------
def _do_compile(self: Any, key: Any, signature: Any, device: Any, constexprs: Any, options: Any, attrs: Any,
                warmup: Any) -> Any:
    kernel = _original(self, key, signature, device, constexprs, options, attrs, warmup)
    if _recording and kernel is not None and _package_kernel(self):
        from triton.runtime.jit import serialize_specialization_data
        args = (self._fn_name, signature, constexprs, attrs, options, key)
        try:
            if _serialize_target:          # newer Tritons (3.9) record the target too
                args += (self.device_caches[device][2],)
            data = serialize_specialization_data(*args)
        except (TypeError, ValueError, AttributeError):  # a constant JSON cannot hold: not recorded
            return kernel
        rec = [self.fn.__module__, self.fn.__qualname__, data]
        with _lock:
            if rec not in _new:
                _new.append(rec)
                counts["recorded"] += 1
    return kernel


def install() -> bool:
    """Put the recording ``_do_compile`` in place (idempotent) and the capture guard (``guard_loads``);
    False when switched off, interpreting, or on a Triton whose ``_do_compile`` or ``preload`` this module
    does not know (then nothing is changed)."""
    global _original, _serialize_target
    if not enabled():
        return False
    try:
        from triton.runtime import jit as jit_module
    except ImportError:
        return False
    fn = jit_module.JITFunction
    with _lock:
        if _original is not None:
            return True
        theirs = getattr(fn, "_do_compile", None)
        params = _params(theirs)
        taken = _params(getattr(jit_module, "serialize_specialization_data", None))
        if (params != _DO_COMPILE_PARAMS or not hasattr(fn, "preload") or taken[:6] != _SERIALIZE_PARAMS
                or taken[6:] not in ([], ["target"])):
            return False
        _serialize_target = taken[6:] == ["target"]
        _original = theirs
        fn._do_compile = _do_compile
    guard_loads()
    return True


def start_recording(context: str) -> None:
    """Record the kernels compiled from now on under ``context`` (a pipeline's construction calls it)."""
    global _recording, _context
    if install():
        _recording, _context = True, context


def finish_recording() -> None:
    """Stop recording and write the records (a pipeline's first decode call, once it returned)."""
    global _recording
    if not _recording:
        return
    _recording = False
    save()


def context_key(*parts: Any) -> str:
    """A start-up's context from what decides its kernels (``repr`` of each part, hashed)."""
    return hashlib.sha256("|".join(repr(p) for p in parts).encode()).hexdigest()[:16]


def _read() -> dict[str, list[list]]:
    global _file
    if _file is None:
        from shapeplan.runtime.backends.triton.paths import read_stamped
        starts = read_stamped(path(), _stamp()).get("starts")
        starts = starts if isinstance(starts, dict) else {}
        _file = {c: [r for r in rs if isinstance(r, list) and len(r) == 3]
                 for c, rs in starts.items() if isinstance(c, str) and isinstance(rs, list)}
    return _file


def records(context: str) -> list[list]:
    """The records of this stamp and ``context`` on disk: [module, qualname, specialization data] each."""
    return list(_read().get(context, ()))


def save() -> bool:
    """Write the records read plus the ones new in this process under the recorded context (when there
    are new ones); the context written last comes last, and the oldest beyond ``MAX_CONTEXTS`` go."""
    with _lock:
        starts = dict(_read())
        known = starts.pop(_context, [])
        fresh = [r for r in _new if r not in known]
        _new.clear()
        if not fresh:
            return False
        starts[_context] = (known + fresh)[:MAX_RECORDS]
        starts = dict(list(starts.items())[-MAX_CONTEXTS:])
    from shapeplan.runtime.backends.triton.paths import write_stamped
    if not write_stamped(path(), _stamp(), {"starts": starts}, "Triton preload records not written"):
        return False
    global _file
    _file = starts
    return True


# ---- preload ----------------------------------------------------------------------------------------------
def _kernel_of(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def preload(context: str, device_index: int | None = None) -> int:
    """Compile (from Triton's cache) and load every kernel recorded under ``context`` on this thread's device
    (``device_index`` when given). Returns how many were loaded; a record that fails is counted and skipped."""
    import torch
    if device_index is not None:
        torch.cuda.set_device(device_index)
    from shapeplan.runtime.backends.triton import env as triton_env
    triton_env.patch()
    from triton.runtime import driver
    dev = driver.active.get_current_device()
    loaded, failed = 0, []
    for module, qualname, data in records(context):
        try:
            fn = _kernel_of(module, qualname)
            key = json.loads(data)["key"]
            kernel = fn.device_caches[dev][0].get(key)
            if kernel is None:
                kernel = fn.preload(data)
            else:
                counts["present"] += 1
            kernel._init_handles()
            loaded += 1
        except Exception as e:  # noqa: BLE001 - a stale record: that kernel compiles at its first launch
            failed.append(f"{qualname}: {type(e).__name__}: {e}"[:200])
    counts["preloaded"] += loaded
    counts["failed"] += len(failed)
    if failed:
        diagnostics.record("FALLBACK", "Triton kernels not preloaded: they load at their first launch",
                           kernels=len(failed), reason=failed[0])
    diagnostics.record("COMPILE", "Triton kernels preloaded", kernels=loaded)
    _preloaded.set()
    return loaded


def preloaded() -> bool:
    """Whether a preload of this process has finished."""
    return _preloaded.is_set()


# ---- the capture guard ------------------------------------------------------------------------------------
_guarded = False


def guard_loads() -> None:
    """Make a Triton kernel's first load inside a CUDA graph capture on this thread raise ``KernelNotLoaded``
    before any driver call (idempotent)."""
    global _guarded
    from triton.compiler.compiler import CompiledKernel
    with _lock:
        if _guarded:
            return
        original = CompiledKernel._init_handles

        def _init_handles(self: Any) -> None:
            if self.module is None and getattr(self, "_run", None) is None:
                import torch
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise KernelNotLoaded(f"Triton kernel {self.name} is not loaded yet: a module cannot be loaded "
                                          "while a CUDA graph is captured")
            return original(self)

        CompiledKernel._init_handles = _init_handles
        _guarded = True


def reset() -> None:
    """Forget this process's records and preload state (tests)."""
    global _file, _recording, _context
    with _lock:
        _new.clear()
        _file = None
        _recording, _context = False, ""
    _preloaded.clear()
    for k in counts:
        counts[k] = 0


__all__ = ["KernelNotLoaded", "context_key", "enabled", "finish_recording", "guard_loads", "install", "preload",
           "preloaded", "records", "save", "start_recording"]
