"""``shapeplan demo``: the built-in default job. Builds a small transformer-style MLP stack with the
builder API, compiles it, runs it in slot_by_slot and in the default mode until it replays, checks the
two agree, prints a table; then generates text with a tiny built-in LLM."""
from __future__ import annotations

import argparse
import time

import numpy as np


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the built-in demo (no files needed)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--skip-llm", action="store_true", help="only the graph part")
    p.set_defaults(func=_demo)


def build_demo_graph(layers: int = 4, hidden: int = 256, seed: int = 0):
    import shapeplan as sp

    rng = np.random.default_rng(seed)
    g = sp.Graph("demo_mlp_stack")
    x = g.placeholder("x", "float32", ("batch", hidden))
    h = x
    for i in range(layers):
        w1 = g.constant(rng.standard_normal((hidden, 4 * hidden), dtype=np.float32) * 0.05, name=f"w1_{i}")
        w2 = g.constant(rng.standard_normal((4 * hidden, hidden), dtype=np.float32) * 0.05, name=f"w2_{i}")
        gamma = g.constant(np.ones(hidden, np.float32), name=f"gamma_{i}")
        # decomposed RMSNorm (the optimizer fuses it), MLP with SiLU, residual add
        var = g.op.ReduceMean(g.op.Mul(h, h), np.array([-1], np.int64), keepdims=1)
        normed = g.op.Mul(g.op.Div(h, g.op.Sqrt(g.op.Add(var, np.float32(1e-6)))), gamma)
        up = g.op.MatMul(normed, w1)
        act = g.op.Mul(up, g.op.Sigmoid(up))
        h = g.op.Add(h, g.op.MatMul(act, w2))
    g.set_outputs(h)
    return g


def _demo(args: argparse.Namespace) -> int:
    import shapeplan as sp

    g = build_demo_graph()
    x = np.random.default_rng(1).standard_normal((8, 256), dtype=np.float32)
    rows = []
    ref = None
    for mode in ("slot_by_slot", "auto"):
        t0 = time.perf_counter()
        eng = sp.compile(g, device=args.device, mode=mode)
        t_compile = time.perf_counter() - t0
        out = None
        times = []
        for _ in range(args.calls):
            t = time.perf_counter()
            out = eng.run({"x": x})
            times.append(time.perf_counter() - t)
        y = next(iter(out.values()))
        if ref is None:
            ref = y
        phase = "-"
        try:
            phase = str(eng.inspect().phase)
        except Exception:  # noqa: BLE001 - introspection is optional in the demo table
            pass
        rows.append((mode, len(eng.graph.nodes), t_compile * 1e3, np.median(times[-5:]) * 1e3, phase,
                     float(np.abs(y - ref).max())))
    print(f"demo graph: {len(g.nodes)} nodes before optimization, input x{list(x.shape)}")
    print(f"{'mode':<14} {'nodes':>5} {'compile ms':>10} {'call ms':>8} {'phase':<24} {'max |diff| vs slot_by_slot':>26}")
    for mode, n, tc, tr, phase, diff in rows:
        print(f"{mode:<14} {n:>5} {tc:>10.1f} {tr:>8.3f} {phase:<24} {diff:>26.3g}")
    if not args.skip_llm:
        try:
            from shapeplan.llm.demo import run_demo
        except ImportError:
            print("\n(LLM demo not available in this build)")
            return 0
        print()
        run_demo(device=args.device)
    return 0
