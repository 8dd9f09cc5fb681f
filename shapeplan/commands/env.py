"""``shapeplan env [--markdown]``: the environment switches (``shapeplan/env.py``), with the values set
now; ``--markdown`` prints the README's table (generated from the same rows)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="list the SHAPEPLAN_* environment switches")
    p.add_argument("--markdown", action="store_true", help="the README's table of switches")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from shapeplan import env
    print(env.markdown() if args.markdown else env.listing(), end="")
    return 0
