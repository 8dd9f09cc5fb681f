"""Replay overhead: a 500-op graph of small ops on CPU, eager torch vs slot_by_slot vs emulated_replay
(diagnostics off and on at level summary). Prints a table (per-call time, per-slot overhead over eager).

The modes are timed in interleaved rounds (each round runs every mode once for ``iters`` calls) and the
best round of each mode is reported, so load from other processes on a shared machine hits every mode
alike and mostly drops out of the minimum.

    python3 -m bench.replay_overhead [--ops 500] [--iters 100] [--rounds 15]

The graph's four ops are registered here in a private domain with the plainest kernels (``a + b``,
``torch.tanh(x)``, ...), as in tests/runtime/graphs.py whose ops the figures in docs/benchmarks/runtime.md
were measured with: the figure is the runtime's cost per slot and does not move when an ONNX kernel does.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

import shapeplan as sp
from shapeplan import diagnostics
from shapeplan.ops.registry import Trait, is_supported, register

D = "spbench"           # the private domain of this benchmark's ops
if not is_supported("Add", D):
    EW = Trait.ELEMENTWISE
    register("Add", domain=D, traits=EW | Trait.COMMUTATIVE)(lambda a, b: a + b)
    register("Mul", domain=D, traits=EW | Trait.COMMUTATIVE)(lambda a, b: a * b)
    register("Tanh", domain=D, traits=EW)(lambda x: torch.tanh(x))
    register("Relu", domain=D, traits=EW)(lambda x: torch.relu(x))


def build(n_ops: int) -> tuple[sp.Graph, list]:
    g = sp.Graph("small_ops")
    o = g.op
    x = g.placeholder("x", "float32", (4, 16))
    h, eager = x, []
    rng = np.random.default_rng(0)
    for i in range(n_ops):
        k = i % 4
        if k == 0:
            c = rng.standard_normal(16).astype(np.float32) * 0.1
            h = o.Add(h, g.constant(c, name=f"c{i}"), _domain=D)
            eager.append(("add", torch.from_numpy(c)))
        elif k == 1:
            h = o.Tanh(h, _domain=D)
            eager.append(("tanh", None))
        elif k == 2:
            c = np.float32(1.01)
            h = o.Mul(h, g.constant(c, name=f"c{i}"), _domain=D)
            eager.append(("mul", torch.tensor(c)))
        else:
            h = o.Relu(h, _domain=D)
            eager.append(("relu", None))
    g.set_outputs(h)
    return g, eager


def run_eager(x: torch.Tensor, prog: list) -> torch.Tensor:
    for kind, c in prog:
        if kind == "add":
            x = x + c
        elif kind == "mul":
            x = x * c
        elif kind == "tanh":
            x = torch.tanh(x)
        else:
            x = torch.relu(x)
    return x


def best_of(fns: dict[str, object], iters: int, rounds: int) -> dict[str, float]:
    """Seconds per call of each fn: the best of ``rounds`` interleaved rounds of ``iters`` calls."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            diag = k.endswith("(summary)")
            if diag:
                diagnostics.enable("ALL", level="summary")
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t) / iters)
            if diag:
                diagnostics.disable()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.replay_overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=500, help="ops in the graph (default 500)")
    ap.add_argument("--iters", type=int, default=100, help="calls per round (default 100)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds; the best is reported (default 15)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    g, prog = build(a.ops)
    xt = torch.randn(4, 16)
    feeds = {"x": xt}
    sbs = sp.Engine(g, mode="slot_by_slot")
    rep = sp.Engine(g, mode="emulated_replay")
    for _ in range(6):
        rep.run(feeds)
    assert rep.inspect().phase == "REPLAYING"
    out = g.outputs[0].name
    for i in range(5):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i))
        assert torch.equal(rep.run({"x": x})[out], sbs.run({"x": x})[out])
    steps = [s.handle.stats() for s in rep.inspect().runner.segments if s.handle is not None]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    t = best_of({"eager torch": lambda: run_eager(xt, prog),
                 "slot_by_slot": lambda: sbs.run(feeds),
                 "emulated_replay": lambda: rep.run(feeds),
                 "emulated_replay + diagnostics(summary)": lambda: rep.run(feeds)}, a.iters, a.rounds)
    eager = t["eager torch"]
    print(f"{a.ops}-op graph of small ops ([4,16] float32), torch threads=1, torch {torch.__version__}, "
          f"{os.cpu_count()} cpus, load avg {load:.2f}; best of {a.rounds} interleaved rounds x {a.iters} calls")
    print(f"replay program: {steps}")
    print(f"{'mode':<40} {'per call (ms)':>14} {'per slot (us)':>14} {'overhead/slot vs eager (us)':>28}")
    for name, v in t.items():
        print(f"{name:<40} {v * 1e3:>14.3f} {v / a.ops * 1e6:>14.2f} {(v - eager) / a.ops * 1e6:>28.2f}")
    print(f"replay speed-up over slot_by_slot: {t['slot_by_slot'] / t['emulated_replay']:.2f}x; replay / eager: "
          f"{t['emulated_replay'] / eager:.2f}; diagnostics(summary) cost on replay: "
          f"{(t['emulated_replay + diagnostics(summary)'] / t['emulated_replay'] - 1) * 100:+.1f} %")


if __name__ == "__main__":
    main()
