"""``shapeplan`` command line. Each subcommand lives in ``shapeplan/commands/<name>.py`` and defines
``register(subparsers)``, which adds its parser and sets ``func`` (args -> exit code)."""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import shapeplan.commands as _commands


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with ``only``, that command module's alone (a light command's process: another
    module's ``register`` may import torch for its choices)."""
    ap = argparse.ArgumentParser(prog="shapeplan", description="compile-once, replay-many inference engine")
    ap.add_argument("--version", action="version", version=f"shapeplan {__import__('shapeplan').__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for m in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if not m.name.startswith("_") and only in (None, m.name):
            importlib.import_module(f"shapeplan.commands.{m.name}").register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    from shapeplan import _light
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == [_light.SERVER_COMMAND] and len(args_in) == 2:   # a keep-alive server (commands/_keepalive.py)
        from shapeplan.commands._keepalive import serve
        return serve(args_in[1])
    ap = build_parser(_light.MODULES.get(args_in[0]) if _light.light_command(args_in) else None)
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    from shapeplan.errors import ShapeplanError
    try:
        rc = int(args.func(args) or 0)
    except ShapeplanError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        rc = 1
    if argv is None and getattr(args, "fast_exit", False):
        from shapeplan import env
        if env.get("SHAPEPLAN_FAST_EXIT"):
            exit_now(rc)
    return rc


def exit_now(rc: int) -> None:
    """End a command's process without the interpreter's teardown: freeing every module and object of
    torch took 0.4-0.5 s after ``shapeplan generate`` on the dev box. What an exit must do still happens,
    in the interpreter's order: threads that are not daemons are joined (and thread pools' exit hooks
    run: a Triton kernel still compiling lands in its cache), the atexit handlers run (the diagnostics
    file, Triton's compile workers, weakref finalizers such as a pipeline's engine thread), stdout and
    stderr are flushed; then ``os._exit``. Only for a command run as a program (``main`` without
    ``argv``), and only commands that ask for it (``fast_exit``)."""
    import atexit
    import threading
    shutdown = getattr(threading, "_shutdown", None)       # CPython's own first step of an exit
    if shutdown is not None:
        shutdown()
    else:
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
