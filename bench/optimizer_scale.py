"""Optimizer scale benchmark: time ``optimize()`` on synthetic graphs of 1k..10k nodes.

    python3 -m bench.optimizer_scale                              # a table: nodes before/after, seconds
    python3 -m bench.optimizer_scale --sizes 1000,10000 --repeat 5
    python3 -m bench.optimizer_scale --profile                    # also cProfile the largest graph

The graph repeats a small block that gives most passes something to do: an RMSNorm written out
(NormalizationFusion), three sibling projections (HorizontalFusion), x*sigmoid(x)*up (ActivationFusion),
x+0 / x*1 (AlgebraicIdentities), a duplicated Relu (CSE), a double transpose (Reordering), a
Reshape chain (ReshapeChainFolding) and constant arithmetic (ConstantFolding).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import shapeplan as sp
from shapeplan.optimize import optimize_with_report


def block(g: sp.Graph, x: sp.Value, d: int, rng: np.random.Generator) -> sp.Value:
    o = g.op
    ms = o.ReduceMean(o.Pow(x, np.float32(2.0)), np.array([-1], dtype=np.int64), keepdims=1)
    n = o.Mul(rng.standard_normal(d).astype(np.float32),
              o.Mul(x, o.Reciprocal(o.Sqrt(o.Add(ms, np.float32(1e-6))))))
    a = o.MatMul(n, rng.standard_normal((d, d)).astype(np.float32))
    b = o.MatMul(n, rng.standard_normal((d, d)).astype(np.float32))
    c = o.MatMul(n, rng.standard_normal((d, d)).astype(np.float32))
    h = o.Mul(o.Mul(a, o.Sigmoid(a)), b)
    h = o.Add(o.Mul(h, np.float32(1.0)), np.float32(0.0))
    r1, r2 = o.Relu(c), o.Relu(c)
    t = o.Transpose(o.Transpose(o.Add(r1, r2), perm=[1, 0]), perm=[1, 0])
    t = o.Reshape(o.Reshape(t, np.array([-1], dtype=np.int64)), np.array(list(x.shape), dtype=np.int64))
    k = o.Add(np.float32(1.0), np.float32(2.0))
    return o.Add(o.Add(h, t), o.Mul(x, k))


def build(n_nodes: int, d: int = 8, seed: int = 0) -> sp.Graph:
    rng = np.random.default_rng(seed)
    g = sp.Graph("scale")
    x = g.placeholder("x", "float32", (4, d))
    while len(g.nodes) < n_nodes:
        x = block(g, x, d, rng)
    g.set_outputs(x)
    return g


def main() -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.optimizer_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,2500,5000,10000", help="graph sizes in nodes, comma-separated")
    ap.add_argument("--profile", action="store_true", help="also cProfile optimize() on the largest graph")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size; best and median reported (default 3)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    # wall time is what the target is about; CPU time (this process) is printed too because the
    # dev box is shared and other processes' load inflates wall time
    print(f"{'nodes':>7} {'after':>7} {'iters':>5} {'best s':>8} {'median s':>9} {'cpu s':>7} {'us/node':>8}")
    last = None
    for n in sizes:
        g = build(n)
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            g2, rep = optimize_with_report(g)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        times.sort()
        print(f"{len(g.nodes):>7} {len(g2.nodes):>7} {rep.iterations:>5} {times[0]:>8.3f} "
              f"{times[len(times) // 2]:>9.3f} {min(cpu):>7.3f} {1e6 * times[0] / len(g.nodes):>8.1f}")
        last = (g, rep)
    if last is not None:
        print()
        print(last[1].to_text())
    if args.profile and last is not None:
        import cProfile
        import pstats
        cProfile.runctx("optimize_with_report(g)", globals(), {"g": last[0], "optimize_with_report": optimize_with_report},
                        "/tmp/optimize_scale.prof")
        pstats.Stats("/tmp/optimize_scale.prof").sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
