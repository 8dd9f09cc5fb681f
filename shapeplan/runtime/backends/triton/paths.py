"""Where Triton's compile cache and shapeplan's generated kernel sources live (no Triton import here).

Triton caches compiled kernels on disk under ``TRITON_CACHE_DIR``; unless the user set it, it is
``<shapeplan cache>/triton``, so ``shapeplan cache clear --all`` clears kernels too and a warm start
reuses them. Generated kernel sources live beside it in ``<shapeplan cache>/triton_src``.
``<shapeplan cache>`` is ``shapeplan.cache.paths.cache_root()``, the plan cache's root too.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from shapeplan.cache.paths import cache_root


def triton_cache_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or cache_root() / "triton")


def source_dir() -> Path:
    d = cache_root() / "triton_src"
    d.mkdir(parents=True, exist_ok=True)
    return d


_key_files: dict[str, dict[str, str]] = {}     # path -> {key: value}, read once per process and file


def keys_in(path: str | Path) -> dict[str, str]:
    """The entries of a one-entry-per-line file (``key`` or ``key value``: the compile manifest, the
    check verdicts) as ``{key: value}``; read once per process, then kept up to date by ``add_key``. A
    missing or unreadable file lists nothing."""
    path = str(path)
    known = _key_files.get(path)
    if known is None:
        known = {}
        try:
            with open(path, encoding="utf-8") as f:
                for ln in f:
                    key, _, value = ln.strip().partition(" ")
                    if key:
                        known[key] = value
        except OSError:
            pass
        _key_files[path] = known
    return known


def add_key(path: str | Path, key: str, value: str = "") -> None:
    """Append ``key [value]`` to the file (one short line: an atomic append; a failure only costs speed)."""
    known = keys_in(path)
    if known.get(key) == value:
        return
    known[key] = value
    try:
        os.makedirs(os.path.dirname(str(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{key} {value}".rstrip() + "\n")
    except OSError:
        pass


def read_stamped(path: str | Path, stamp: str) -> dict:
    """The JSON object in ``path`` when its "stamp" is ``stamp``; {} when the file is missing, unreadable, or
    from another stamp (records kept between processes: triton/jit_keys.py, triton/preload.py)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("stamp") == stamp else {}


def write_stamped(path: str | Path, stamp: str, body: dict, failed: str) -> bool:
    """Write ``{"stamp": stamp, **body}`` to ``path`` atomically (a temporary file renamed over it); on
    failure a FALLBACK event says ``failed`` and the result is False (it only costs the next start time)."""
    path = str(path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"stamp": stamp, **body}, f)
        os.replace(tmp, path)
    except OSError as e:
        from shapeplan import diagnostics
        diagnostics.record("FALLBACK", failed, reason=str(e)[:200])
        return False
    return True


def kernel_cache_paths() -> dict[str, Path]:
    """What start-up keeps beside the plans: Triton's cache (with the compile-worker manifest), generated
    kernel sources, the capture-check verdicts and the frozen-plan records (runtime/frozen_records.py)."""
    root = cache_root()
    return {"triton": triton_cache_dir(), "sources": root / "triton_src", "verdicts": root / "triton_verified.txt",
            "frozen": root / "frozen"}


def kernel_cache_summary() -> dict[str, object]:
    p = kernel_cache_paths()
    compiled = 0
    if p["triton"].is_dir():
        compiled = sum(1 for d in p["triton"].iterdir() if d.is_dir() and any(d.glob("*.cubin")))
    sources = len(list(p["sources"].glob("*.py"))) if p["sources"].is_dir() else 0
    verdicts = len(p["verdicts"].read_text().splitlines()) if p["verdicts"].is_file() else 0
    frozen = len(list(p["frozen"].glob("*.json"))) if p["frozen"].is_dir() else 0
    return {"triton_dir": str(p["triton"]), "compiled_kernels": compiled, "generated_sources": sources,
            "verified_steps": verdicts, "frozen_plan_records": frozen}


def clear_kernel_caches() -> list[str]:
    """Remove the kernel caches (returns what was removed). A ``TRITON_CACHE_DIR`` the user pointed
    outside shapeplan's cache directory is left alone: it may hold other programs' kernels."""
    root, removed = cache_root().resolve(), []
    for name, path in kernel_cache_paths().items():
        if not path.exists():
            continue
        if name == "triton" and root not in path.resolve().parents:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path))
    return removed
