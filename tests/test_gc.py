"""shapeplan/_gc.py: a command's process holds the cyclic collector off while shapeplan imports and freezes
what the import made; a program importing shapeplan keeps Python's collector as it was."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from shapeplan import _gc

PROBE = "import gc, sys; {argv}import shapeplan.llm; print(gc.get_freeze_count(), gc.isenabled())"


def _probe(argv0: str | None, **env: str) -> tuple[int, bool]:
    code = PROBE.format(argv=f"sys.argv[0] = {argv0!r}; " if argv0 else "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout.split()
    return int(out[0]), out[1] == "True"


def test_a_library_import_leaves_the_collector_alone():
    assert _probe(None) == (0, True)


def test_a_command_process_freezes_what_the_import_made():
    frozen, enabled = _probe("/venv/bin/shapeplan")
    assert frozen > 50_000 and enabled                   # torch's objects and ours, in the permanent generation
    assert _probe("/venv/bin/shapeplan", SHAPEPLAN_GC_PAUSE="0") == (0, True)


@pytest.mark.parametrize("orig,argv0,want", [
    (["python3", "-m", "shapeplan", "generate"], "-m", True),
    (["python3", "-m", "shapeplan.cli"], "-m", True),
    (["python3", "-m", "bench.startup"], "-m", False),
    (["python3", "-c", "..."], "-c", False),
    (["/venv/bin/shapeplan", "serve"], "/venv/bin/shapeplan", True),
])
def test_command_process(orig, argv0, want, monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", orig)
    monkeypatch.setattr(sys, "argv", [argv0])
    assert _gc.command_process() is want


def test_startup_restores_the_collector_after_an_error():
    was = gc.get_freeze_count()
    with pytest.raises(RuntimeError):
        with _gc.startup(command=True):
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled() and gc.get_freeze_count() == was         # nothing frozen when the block failed
    with _gc.startup(command=False):
        assert gc.isenabled()
