"""Replay overhead: a 500-op graph of small ops on CPU, eager torch vs slot_by_slot vs emulated_replay
(diagnostics off and on at level summary). Prints a table (per-call time, per-slot overhead over eager).

    python bench/replay_overhead.py [--ops 500] [--iters 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import shapeplan as sp  # noqa: E402
from shapeplan import diagnostics  # noqa: E402
from tests.runtime.graphs import op  # noqa: E402


def build(n_ops: int) -> tuple[sp.Graph, list]:
    g = sp.Graph("small_ops")
    o = op(g)
    x = g.placeholder("x", "float32", (4, 16))
    h, eager = x, []
    rng = np.random.default_rng(0)
    for i in range(n_ops):
        k = i % 4
        if k == 0:
            c = rng.standard_normal(16).astype(np.float32) * 0.1
            h = o.Add(h, g.constant(c, name=f"c{i}"))
            eager.append(("add", torch.from_numpy(c)))
        elif k == 1:
            h = o.Tanh(h)
            eager.append(("tanh", None))
        elif k == 2:
            c = np.float32(1.01)
            h = o.Mul(h, g.constant(c, name=f"c{i}"))
            eager.append(("mul", torch.tensor(c)))
        else:
            h = o.Relu(h)
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


def timeit(fn, iters: int) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(iters // 5):
            fn()
        ts.append((time.perf_counter() - t) / (iters // 5))
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=500)
    ap.add_argument("--iters", type=int, default=300)
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
    ref = sbs.run(feeds)[g.outputs[0].name]
    assert torch.equal(rep.run(feeds)[g.outputs[0].name], ref)
    rows = [("eager torch", timeit(lambda: run_eager(xt, prog), a.iters))]
    rows.append(("slot_by_slot", timeit(lambda: sbs.run(feeds), a.iters)))
    rows.append(("emulated_replay", timeit(lambda: rep.run(feeds), a.iters)))
    diagnostics.enable("ALL", level="summary")
    rows.append(("emulated_replay + diagnostics(summary)", timeit(lambda: rep.run(feeds), a.iters)))
    diagnostics.disable()
    eager = rows[0][1]
    print(f"{a.ops}-op graph of small ops ([4,16] float32), torch threads=1, torch {torch.__version__}")
    print(f"{'mode':<40} {'per call (ms)':>14} {'overhead/slot vs eager (us)':>28}")
    for name, t in rows:
        print(f"{name:<40} {t * 1e3:>14.3f} {(t - eager) / a.ops * 1e6:>28.2f}")
    print(f"replay speed-up over slot_by_slot: {rows[1][1] / rows[2][1]:.2f}x; "
          f"diagnostics(summary) cost on replay: {(rows[3][1] / rows[2][1] - 1) * 100:+.1f} %")


if __name__ == "__main__":
    main()
