"""Triton's cache key of each of shapeplan's kernels, remembered between processes.

A kernel's first launch in a process computes Triton's key of its Python function
(``JITCallable.cache_key``): it parses the function's source (``ast.parse``) and walks it for the kernels it
calls and the globals it reads, recursively. On the H200 that was ~2 ms of Python a kernel, ~0.1-0.2 s of a
warm start spent holding the GIL beside the warm-up threads (docs/benchmarks/decode.md, forty-fourth
session). The key depends only on what the walk reads: the sources of the function and of every kernel it
calls, its starting line and the values of the globals it uses. So for shapeplan's own kernels
(functions defined in this package's files) this module keeps the key Triton computed in
``<Triton cache>/shapeplan_jit_keys.json`` and sets it again in a later process, when

- the *stamp* is unchanged: the path, size and modification time of every Python file of shapeplan and
  Triton's installation stamp (``workers.stamp()``), so an edited kernel or helper anywhere in the package,
  or another Triton, starts afresh (the way Python's ``.pyc`` check works); and
- each global the walk recorded (Triton's ``used_global_vals``: name, module, value) still has the same
  ``repr`` in the same module.

Then the function's ``hash`` and ``used_global_vals`` are what Triton's own computation gives (the tests
compare them for every kernel of the package). Anything else (a function outside the package, a global
read from a closure, an unreadable file) takes Triton's computation as before.

The same file keeps each kernel's *source lines*. ``@triton.jit`` reads them when the kernel's module is
imported (``inspect.getsourcelines``: the file's lines, then Python's tokenizer over the function's block
to find where it ends): 75 ms for the package's 84 kernels under Python 3.12 on the 2-CPU dev box, 119 ms
under 3.11, and a warm start imports the kernel modules while it runs. With the stamp unchanged the file
is the one read before (the ``.pyc`` rule again), so its lines and first line number are taken from the
record (``SourceLines`` stands in for ``inspect`` in ``triton.runtime.jit`` only; any other function, and
any function of a file without a record, is read as before).

The file is written at exit when something new was computed. ``SHAPEPLAN_TRITON_JIT_KEYS`` (off by
default until timed on a GPU).
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import hashlib
import inspect
import os
import sys
import threading
from typing import Any

from shapeplan import env
from shapeplan.cache.fingerprint import PACKAGE_ROOT as ROOT

VERSION = 1
_lock = threading.Lock()
_original: Any = None
_file: dict[str, dict] | None = None               # the records read: {"keys": {..}, "sources": {..}}
_new: dict[str, dict] = {"keys": {}, "sources": {}}  # computed in this process, not yet written
_jit_module: Any = None                             # triton.runtime.jit while its ``inspect`` is ours
counts = {"restored": 0, "computed": 0, "sources_restored": 0, "sources_read": 0}


def path() -> str:
    from shapeplan.runtime.backends.triton.paths import triton_cache_dir
    return str(triton_cache_dir() / "shapeplan_jit_keys.json")


@functools.cache
def stamp() -> str:
    from shapeplan.cache.fingerprint import package_stamp
    from shapeplan.runtime.backends.triton import workers
    return hashlib.sha256(f"v{VERSION}|{sys.version_info[:2]}|{package_stamp()}|{workers.stamp()}".encode()).hexdigest()


def package_file(fn: Any) -> str | None:
    """The file that defines the function ``fn`` when it is one of this package's (else None)."""
    code = getattr(fn, "__code__", None)
    file = os.path.abspath(code.co_filename) if code is not None else ""
    return file if file.startswith(ROOT + os.sep) else None


def _ident(fn: Any) -> str | None:
    """The record's name of a kernel of this package (None for any other function)."""
    src = getattr(fn, "_src", None)
    if package_file(getattr(fn, "fn", None)) is None or not isinstance(src, str):
        return None
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    return f"{getattr(fn, '_fn_name', fn.__qualname__)}|{getattr(fn, 'starting_line_number', 0)}|{digest}"


def _read() -> dict[str, dict]:
    """The file's records when its stamp is this process's, else empty ones (read once a process)."""
    global _file
    if _file is None:
        from shapeplan.runtime.backends.triton.paths import read_stamped
        data = read_stamped(path(), stamp())
        _file = {part: v if isinstance(v := data.get(part), dict) else {} for part in ("keys", "sources")}
    return _file


def _records() -> dict[str, dict[str, Any]]:
    return _read()["keys"]


def _sources() -> dict[str, list]:
    return _read()["sources"]


def _source_ident(fn: Any) -> str | None:
    """The source record's name of a function defined in this package (None for any other object)."""
    file = package_file(fn)
    if file is None:
        return None
    return f"{os.path.relpath(file, ROOT)}|{fn.__code__.co_firstlineno}|{getattr(fn, '__qualname__', '')}"


class SourceLines:
    """Stands in for the ``inspect`` module inside ``triton.runtime.jit`` (module doc): ``getsourcelines``
    of a function of this package comes from the record when the stamp matches; every other name is
    ``inspect``'s own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    @staticmethod
    def getsourcelines(obj: Any) -> tuple[list[str], int]:
        ident = _source_ident(obj)
        if ident is not None:
            rec = _sources().get(ident)        # not under _lock: loading may import modules with kernels
            if isinstance(rec, list) and len(rec) == 2:
                counts["sources_restored"] += 1
                return list(rec[0]), rec[1]
        lines, start = inspect.getsourcelines(obj)
        if ident is not None:
            with _lock:
                _new["sources"][ident] = [list(lines), start]
            counts["sources_read"] += 1
        return lines, start


def _globals_of(fn: Any) -> list[list[str]] | None:
    """[module, name, repr] of each global Triton recorded; None if one is not a module's global."""
    out = []
    for (name, _), (val, var_dict) in fn.used_global_vals.items():
        mod = var_dict.get("__name__") if isinstance(var_dict, dict) else None
        if not isinstance(mod, str) or getattr(sys.modules.get(mod), "__dict__", None) is not var_dict:
            return None
        out.append([mod, name, repr(val)])
    return out


def _restore(fn: Any, ident: str) -> bool:
    rec = _records().get(ident)
    if not rec:
        return False
    used = {}
    for mod, name, text in rec["globals"]:
        var_dict = getattr(sys.modules.get(mod), "__dict__", None)
        if var_dict is None or name not in var_dict or repr(var_dict[name]) != text:
            return False
        used[(name, id(var_dict))] = (copy.deepcopy(var_dict[name]), var_dict)
    fn.used_global_vals = dict(sorted(used.items()))
    fn.hash = rec["hash"]
    return True


def _cache_key(self: Any) -> str:
    if self.hash is None:
        ident = _ident(self)
        if ident is not None:
            with getattr(self, "_hash_lock", None) or contextlib.nullcontext():
                if self.hash is None and _restore(self, ident):
                    counts["restored"] += 1
                    return self.hash
            key = _original(self)
            found = _globals_of(self)
            if found is not None and not key.startswith("recursion:"):
                with _lock:
                    _new["keys"][ident] = {"hash": key, "globals": found}
                counts["computed"] += 1
            return key
    return _original(self)


def save() -> None:
    """Write the records (the ones read plus the new ones) when something new was computed."""
    with _lock:
        if not any(_new.values()):
            return
        merged = {part: {**_read()[part], **new} for part, new in _new.items()}
        for new in _new.values():
            new.clear()
    from shapeplan.runtime.backends.triton.paths import write_stamped
    write_stamped(path(), stamp(), merged, "Triton key records not written")


def install() -> bool:
    """Put the remembering key in place of ``JITCallable.cache_key`` and ``SourceLines`` in place of
    ``triton.runtime.jit``'s ``inspect`` (idempotent); False when switched off or when this Triton's
    ``cache_key`` is not the property this module knows (then neither is changed)."""
    global _original, _jit_module
    if not env.get("SHAPEPLAN_TRITON_JIT_KEYS"):
        return False
    try:
        import triton.runtime.jit as jit_module
        from triton.runtime.jit import JITCallable
    except ImportError:
        return False
    with _lock:
        if _original is not None:
            return True
        prop = JITCallable.__dict__.get("cache_key")
        if not isinstance(prop, property) or prop.fget is None:
            return False
        _original = prop.fget
        JITCallable.cache_key = property(_cache_key, doc=prop.__doc__)
        if getattr(jit_module, "inspect", None) is inspect:
            jit_module.inspect = SourceLines()
            _jit_module = jit_module
    atexit.register(save)
    return True


def uninstall() -> None:
    """Triton's own ``cache_key`` and ``inspect`` again (tests)."""
    global _original, _file, _jit_module
    with _lock:
        if _original is not None:
            from triton.runtime.jit import JITCallable
            JITCallable.cache_key = property(_original)
            _original = None
        if _jit_module is not None:
            _jit_module.inspect = inspect
            _jit_module = None
        _file = None
        for new in _new.values():
            new.clear()
