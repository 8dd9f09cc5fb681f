"""Compile time cold vs warm (disk plan cache) on a 1,000-node graph loaded from an ONNX file (the
small-ops graph of bench/replay_overhead.py). Prints a table: the cold start (compile + write the
cache), then two warm starts that load the plan from the disk cache.

    python3 -m bench.compile_cold_warm [--nodes 1000] [--optimize]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import shapeplan as sp
from bench.replay_overhead import build


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.compile_cold_warm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000, help="nodes in the graph (default 1000)")
    ap.add_argument("--optimize", action="store_true", help="include the optimizer in the cold path")
    a = ap.parse_args()
    g, _ = build(a.nodes)
    path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    from shapeplan.ir.onnx_io import save_onnx
    save_onnx(g, path)
    with tempfile.TemporaryDirectory() as d:
        rows = []
        for label, force in (("cold (compile + write cache)", True), ("warm (disk cache)", False),
                             ("warm (disk cache), again", False)):
            t = time.perf_counter()
            e = sp.compile(path, optimize=a.optimize, disk_cache=True, cache_dir=d, force_recompile=force)
            rows.append((label, time.perf_counter() - t, e.compile_info["source"]))
        print(f"{a.nodes}-node graph from an ONNX file; optimizer {'on' if a.optimize else 'off'}")
        print(f"{'start':<32} {'seconds':>9}  source")
        for label, t, src in rows:
            print(f"{label:<32} {t:>9.3f}  {src}")


if __name__ == "__main__":
    main()
