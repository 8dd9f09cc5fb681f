"""``shapeplan cache ls|clear [--all]``: the on-disk plan cache (and, with ``--all``, the kernel caches)."""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or clear the on-disk plan cache")
    p.add_argument("action", choices=["ls", "clear"])
    p.add_argument("--dir", default=None, help="plan cache directory (default: <cache root>/plans, the root being "
                   "$SHAPEPLAN_CACHE_DIR or the user cache dir)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true",
                   help="clear: also the Triton kernel cache, generated kernel sources, capture-check verdicts "
                        "and frozen-plan records (a cold start afterwards compiles every kernel again)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from shapeplan.cache.disk import DiskCache
    dc = DiskCache(args.dir)
    from shapeplan.runtime.backends.triton import paths as triton_paths
    if args.action == "clear":
        n = dc.clear()
        print(f"removed {n} plan(s) from {dc.directory}")
        if args.all:
            for path in triton_paths.clear_kernel_caches():
                print(f"removed {path}")
        return 0
    entries = dc.entries()
    kernels = triton_paths.kernel_cache_summary()
    if args.json:
        print(json.dumps({"directory": dc.directory, "override_dir": dc.override_dir, "entries": entries,
                          "kernels": kernels}, indent=2, default=str))
        return 0
    print(f"plan cache: {dc.directory}" + (f"  (override: {dc.override_dir})" if dc.override_dir else ""))
    if not entries:
        print("  (empty)")
    for e in entries:
        fp = e.get("fingerprint") or {}
        status = "ok" if e.get("valid") else f"INVALID: {e.get('error')}"
        print(f"  {e['key']}  {e['bytes']:>10} B  {e['modified']}  "
              f"{(e.get('meta') or {}).get('graph', '?')}  torch {fp.get('torch', '?')}  "
              f"{'ro ' if e['read_only'] else ''}{status}")
    print(f"kernel cache: {kernels['triton_dir']}  {kernels['compiled_kernels']} compiled Triton kernel(s), "
          f"{kernels['generated_sources']} generated source(s), {kernels['verified_steps']} verified step(s), "
          f"{kernels['frozen_plan_records']} frozen-plan record(s)")
    return 0
