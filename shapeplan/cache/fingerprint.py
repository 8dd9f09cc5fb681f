"""Build fingerprint: what must match for a cached plan to be reused."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from typing import Any, Callable


def fingerprint(device: str = "cpu") -> dict[str, Any]:
    import torch                  # (here: tree_stamp serves processes that import no torch, shapeplan/_light.py)

    import shapeplan
    from shapeplan.plan.serialize import FORMAT_VERSION
    return {"shapeplan": shapeplan.__version__, "torch": torch.__version__.split("+")[0],
            "python": f"{sys.version_info.major}.{sys.version_info.minor}", "device": str(device),
            "plan_format": FORMAT_VERSION, "sources": sources_digest()}


#: the shapeplan package directory (whose Python files the stamps and digests cover)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def sources_digest() -> str:
    """sha256 of shapeplan's Python sources (their paths and contents; ~5 ms, once a process): a plan
    built by other code (an edited checkout, another commit with the same version) is not reused.
    Contents, not modification times, so the same release installed elsewhere matches (a read-only
    override cache built on another machine stays valid)."""
    h = hashlib.sha256()
    for d, dirs, files in os.walk(PACKAGE_ROOT):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(d, name)
                with open(path, "rb") as f:
                    h.update(f"{os.path.relpath(path, PACKAGE_ROOT)}\0".encode() + f.read() + b"\0")
    return h.hexdigest()[:16]


def cache_key(model_hash: str, options: dict[str, Any], fp: dict[str, Any]) -> str:
    blob = json.dumps({"model": model_hash, "options": options, "fingerprint": fp}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


def tree_stamp(root: str, keep: Callable[[str, str], bool], skip_dirs: tuple[str, ...] = ("__pycache__",)) -> tuple[str, int]:
    """(sha256 of the relative path, size and modification time of every file under ``root`` that
    ``keep(directory, name)`` accepts, files counted): a change to any of them changes it, the way
    Python's ``.pyc`` check works, without reading the files."""
    h, counted = hashlib.sha256(), 0
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in skip_dirs)
        for name in sorted(files):
            if not keep(d, name):
                continue
            path = os.path.join(d, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            h.update(f"{os.path.relpath(path, root)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            counted += 1
    return h.hexdigest(), counted


@functools.cache
def package_stamp() -> str:
    """``tree_stamp`` of shapeplan's Python files (once a process): the frozen-plan records and the
    remembered Triton keys are valid only for the sources that made them."""
    return tree_stamp(PACKAGE_ROOT, lambda d, name: name.endswith(".py"))[0]
