"""Bytecode for a ``shapeplan`` command where the installation ships none.

``pip install`` byte-compiles what it installs, so ``import torch`` reads ``.pyc`` files. Some images do
not: the lent GPU machines ship torch without a single ``.pyc`` and set ``PYTHONDONTWRITEBYTECODE=1``, so
every process compiles torch (and Triton) from source: 1 s of ``import torch`` becomes 3.5 s on the dev
box, 3-6 s there (docs/benchmarks/decode.md, fourteenth session). Each ``shapeplan generate`` paid it.

In a command's process (the ``shapeplan`` console script, ``python -m shapeplan``: ``_gc.command_process``)
with ``SHAPEPLAN_PYCACHE`` on, ``setup`` points Python's bytecode cache at ``<cache root>/pycache``
(``sys.pycache_prefix``, Python's own mechanism: .pyc files in a tree that mirrors the source paths,
checked against each source's size and modification time as usual) and lets Python write there, before
torch is imported. The first command pays the compile once and writes the tree (~25 MB for torch);
every later one reads it. ``auto`` (the default) does this only where the installed torch has no
bytecode of its own: with a prefix Python ignores the ``__pycache__`` folders beside the sources, so on
a normal install it would only copy what is already there. Child processes (Triton's compile workers,
the tokenizer helper) inherit the prefix through ``PYTHONPYCACHEPREFIX`` and read the same tree.

The folder is made private (0700); one that another user owns or may write is not used, since what it
holds runs as code. A program that imports shapeplan as a library is left alone (where bytecode goes is
the program's choice), and so is a prefix the user set (``PYTHONPYCACHEPREFIX`` / ``-X pycache_prefix``).
This module imports the standard library and shapeplan's ``_gc``, ``env`` and ``cache.paths`` only: it
runs before torch.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from shapeplan import _gc, env


def ships_bytecode(module: str = "torch") -> bool:
    """Whether ``module`` (a top-level package, found without importing it) has a ``.pyc`` of its
    ``__init__`` for this Python beside its source; True when it is not found or is not source."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return True
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return True
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def setup(command: bool | None = None) -> str | None:
    """In a command's process (or with ``command=True``), per ``SHAPEPLAN_PYCACHE``: set the bytecode
    prefix to ``<cache root>/pycache`` and allow writing there. Returns the prefix it set, else None."""
    if not (_gc.command_process() if command is None else command) or sys.pycache_prefix is not None:
        return None
    mode = env.get("SHAPEPLAN_PYCACHE")
    if mode == "off" or (mode == "auto" and ships_bytecode("torch")):
        return None
    from shapeplan.cache.paths import cache_root
    prefix = os.path.abspath(cache_root() / "pycache")     # a relative one would follow the working directory
    try:
        os.makedirs(prefix, mode=0o700, exist_ok=True)
        st = os.stat(prefix)
    except OSError:                        # an unwritable cache root: leave Python as it was
        return None
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        return None                        # bytecode runs as code: only from a folder no one else may write
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    return prefix


__all__ = ["setup", "ships_bytecode"]
