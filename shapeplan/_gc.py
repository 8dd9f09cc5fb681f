"""Python's cyclic garbage collector during a ``shapeplan`` command's start-up. Importing torch and
building a pipeline allocate about a million objects that live until the command ends; every full
collection on the way walks all of them (four during ``import shapeplan.llm`` on the dev box, 10-90 ms
each: 150-190 ms of a 1.2-1.5 s ``shapeplan generate`` of a tiny model) and finds almost nothing.
In a command's process (the ``shapeplan`` console script, ``python -m shapeplan``) and with
``SHAPEPLAN_GC_PAUSE`` on (the default), the collector is held off while shapeplan's packages import and
while the command builds its pipeline, and what they made is then frozen (``gc.freeze``: moved to the
permanent generation, which later collections skip and never free). A program that imports shapeplan as
a library keeps Python's collector as it was: freezing is a process-wide choice that is the program's
to make."""
from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Iterator


def command_process() -> bool:
    """Whether this process is a ``shapeplan`` command (its console script or ``python -m shapeplan``)."""
    if os.path.basename(sys.argv[0] if sys.argv else "") == "shapeplan":
        return True
    orig = getattr(sys, "orig_argv", [])
    return "-m" in orig[:-1] and orig[orig.index("-m") + 1] in ("shapeplan", "shapeplan.cli")


@contextlib.contextmanager
def startup(command: bool | None = None) -> Iterator[None]:
    """Inside the block the cyclic collector is off (reference counting still frees what it can); after it,
    every object alive is frozen and the collector's state restored. Only in a command's process (or with
    ``command=True``) and with ``SHAPEPLAN_GC_PAUSE`` on; otherwise the block runs as it is."""
    from shapeplan import env
    if not ((command_process() if command is None else command) and env.get("SHAPEPLAN_GC_PAUSE")):
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was:
            gc.enable()
