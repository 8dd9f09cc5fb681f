"""Where shapeplan keeps its caches: one root, computed here only.

    <root>/plans          compiled plans (``DiskCache``)
    <root>/triton         Triton's compile cache, unless the user set ``TRITON_CACHE_DIR``
    <root>/triton_src     generated Triton kernel sources
    <root>/triton_verified.txt, <root>/frozen    capture-check verdicts, frozen-plan records

``<root>`` is ``$SHAPEPLAN_CACHE_DIR``, else ``shapeplan`` under the user cache directory
(``$XDG_CACHE_HOME`` or ``~/.cache``; ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows).
Read on every call (cheap, and never on a replay), so a test or a long process may move it.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from shapeplan import env


def user_cache_dir() -> Path:
    """The platform's per-user cache directory (not shapeplan's own)."""
    if sys.platform == "darwin":
        return Path(os.path.expanduser("~/Library/Caches"))
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA") or os.path.expanduser("~"))
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))


def cache_root() -> Path:
    """shapeplan's cache directory: ``$SHAPEPLAN_CACHE_DIR``, else ``<user cache dir>/shapeplan``."""
    root = env.get("SHAPEPLAN_CACHE_DIR")
    return Path(root) if root else user_cache_dir() / "shapeplan"


def plans_dir() -> Path:
    """The disk plan cache's directory: ``<root>/plans``."""
    return cache_root() / "plans"


__all__ = ["cache_root", "plans_dir", "user_cache_dir"]
