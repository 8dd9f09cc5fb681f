"""``shapeplan ps`` and ``shapeplan stop [--model DIR]``: this user's keep-alive servers (``generate
--keep-alive``, shapeplan/commands/_keepalive.py), listed or stopped. Both need the standard library only."""
from __future__ import annotations

import argparse
import json
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ps", help="list the keep-alive servers (generate --keep-alive) of this user")
    p.add_argument("--json", action="store_true", help="one JSON record per server")
    p.set_defaults(func=_ps)
    p = sub.add_parser("stop", help="stop the keep-alive servers (generate --keep-alive) of this user")
    p.add_argument("--model", default=None, help="only the servers of this checkpoint (default: all)")
    p.set_defaults(func=_stop)


def _ps(args: argparse.Namespace) -> int:
    from shapeplan.commands._keepalive import refused, servers
    try:
        recs = servers()
    except PermissionError as e:
        return refused(e)
    if args.json:
        for r in recs:
            print(json.dumps(r))
        return 0
    if not recs:
        print("no keep-alive server running")
        return 0
    now = time.time()
    print(f"{'pid':>8}  {'device':<8} {'mode':<14} {'requests':>8}  {'ends in':>8}  model")
    for r in recs:
        print(f"{r['pid']:>8}  {str(r.get('device')):<8} {str(r.get('mode')):<14} {r['requests']:>8}  "
              f"{max(0.0, r['until'] - now):>7.0f}s  {r['model']}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    from shapeplan.commands._keepalive import refused, stop
    try:
        done = stop(args.model)
    except PermissionError as e:
        return refused(e)
    for r in done:
        print(f"stopped {r['pid']} ({r['model']}, {r.get('device')})")
    if not done:
        print("no keep-alive server running" + (f" for {args.model}" if args.model else ""))
    return 0
