"""Work a command can start before ``import shapeplan`` imports torch (1.2-1.5 s on the machines measured,
issue 22): the first lines of ``shapeplan/__init__.py`` call ``start()``.

When this process is the ``shapeplan`` command (the console script, or ``python -m shapeplan``) running
``generate`` or ``chat`` with ``--model DIR`` and DIR holds a ``tokenizer.json``, that file is parsed on a
thread by ``tokenizers`` (0.39 s for a 128k vocabulary on the 2-core box), which releases the GIL while it
parses: the parse then overlaps torch's import instead of following it (measured: torch's import alone
1.48 s, with the parse beside it 1.55 s). ``llm.tokenizer.Tokenizer`` takes the result through
``tokenizer(path)`` when the file's size and modification time are still the ones read; otherwise, and for
any other process, it loads the file itself as before. A failure here is never reported: the normal load
that follows reports it. This module imports the standard library only.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

#: the commands whose ``--model DIR`` tokenizer is read early
COMMANDS = ("generate", "chat")

_pending: dict[str, tuple[threading.Thread, tuple[int, int], list[Any]]] = {}


def cli_args(argv: list[str], orig_argv: list[str]) -> list[str] | None:
    """The arguments after the program name when this process is the ``shapeplan`` command: run as the
    console script (``argv[0]`` named shapeplan) or as ``python -m shapeplan`` (while the package imports,
    ``argv[0]`` is ``-m`` and the interpreter's own argv names the module); else None."""
    if argv and os.path.basename(argv[0]) in ("shapeplan", "shapeplan.exe"):
        return argv[1:]
    if argv and argv[0] == "-m" and "-m" in orig_argv:
        i = orig_argv.index("-m")
        if orig_argv[i + 1:i + 2] == ["shapeplan"]:
            return argv[1:]
    return None


def model_dir(args: list[str]) -> str | None:
    """``--model``'s value when ``args`` run one of ``COMMANDS`` (the command first, as argparse sees it)."""
    if not args or args[0] not in COMMANDS:
        return None
    for i, a in enumerate(args[1:], 1):
        if a == "--model" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
    return None


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def start(argv: list[str] | None = None, orig_argv: list[str] | None = None) -> None:
    """Start the early reads this process's command line asks for (module doc); nothing otherwise."""
    args = cli_args(sys.argv if argv is None else argv, getattr(sys, "orig_argv", []) if orig_argv is None
                    else orig_argv)
    model = model_dir(args) if args is not None else None
    if not model:
        return
    path = os.path.realpath(os.path.join(model, "tokenizer.json"))
    try:
        stamp = _stamp(path)
    except OSError:
        return
    box: list[Any] = []

    def parse() -> None:
        try:
            from tokenizers import Tokenizer
            box.append(Tokenizer.from_file(path))
        except Exception:  # noqa: BLE001, S110 - Tokenizer() loads the file again and reports
            pass
    t = threading.Thread(target=parse, name="shapeplan-early-tokenizer", daemon=True)
    t.start()
    _pending[path] = (t, stamp, box)


def tokenizer(path: str) -> Any | None:
    """The ``tokenizers.Tokenizer`` parsed early from ``path`` (waiting for the parse to end), or None:
    none was started for it, it failed, or the file changed since (size or modification time). Taken
    once: a second call returns None."""
    real = os.path.realpath(path)
    entry = _pending.pop(real, None)
    if entry is None:
        return None
    thread, stamp, box = entry
    thread.join()
    try:
        same = _stamp(real) == stamp
    except OSError:
        return None
    return box[0] if box and same else None
