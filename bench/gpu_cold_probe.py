"""Where a cold triton-mode start of the block stack spends its time (issue 5 probe).

    SHAPEPLAN_CACHE_DIR=$(mktemp -d) python bench/gpu_cold_probe.py [--profile 30]

Builds bench/gpu_blocks.py's 12-layer stack, runs it once in cuda_graphs mode (CUDA libraries loaded,
as in that bench), then times sp.compile(mode="triton") and the calls up to the first replay, with the
time to Engine creation separately; ``--profile N`` prints the N largest cumulative and own times;
``--timeline`` prints the compile/lifecycle events with their times; ``--prestart`` starts the compile
workers and waits until they are ready before the clock starts (what a start would take if the workers'
own start cost nothing: the floor of the rest of the chain).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpu_blocks as gb  # noqa: E402

import shapeplan as sp  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--prestart", action="store_true")
    a = ap.parse_args()
    gb._ensure_matmul()
    g = gb.build_graph(gb.make_weights(12), 1, 1, "float16")
    x = torch.randn(1, 1, gb.HIDDEN, device="cuda").half()
    e = sp.compile(g, device="cuda", mode="cuda_graphs", optimize=True)
    for _ in range(4):
        e.run({"x": x})
    torch.cuda.synchronize()
    del e
    if a.prestart:
        from shapeplan.runtime.backends.triton import workers as triton_workers
        triton_workers._get_pool()
        while triton_workers.starting():
            time.sleep(0.005)
    from shapeplan import diagnostics
    if a.timeline:
        diagnostics.enable(categories=["LIFECYCLE", "SEGMENT", "GRAPH_REPLAY", "COMPILE", "FALLBACK", "VERIFY"],
                           level="detailed")
        diagnostics.record("LIFECYCLE", "t0")
    prof = cProfile.Profile() if a.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    eng = sp.compile(g, device="cuda", mode="triton", optimize=True)
    t1 = time.perf_counter()
    for _ in range(8):
        eng.run({"x": x})
        if eng.inspect().phase in ("REPLAYING", "REPLAY_BLOCKED"):
            break
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    if prof:
        prof.disable()
    print(f"sp.compile {t1 - t0:.3f} s, to first replay {t2 - t0:.3f} s  "
          f"(workers={os.environ.get('SHAPEPLAN_TRITON_WORKERS', 'default')}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, torch threads {torch.get_num_threads()})")
    if a.timeline:
        evs = diagnostics.events()
        base = next(e.t for e in evs if e.message == "t0")
        keep = ("segment", "kernels", "reason", "kernel", "seconds", "workers", "compile_s", "launcher_s",
                "sent_at_s", "spawn_s")
        for e in evs:
            f = {k: v for k, v in e.fields.items() if k in keep}
            print(f"  {1000 * (e.t - base):8.1f} ms  {e.category:<12} {e.message}  {f}")
    if prof:
        for key in ("cumulative", "tottime"):
            s = pstats.Stats(prof)
            s.sort_stats(key).print_stats(a.profile)


if __name__ == "__main__":
    main()
