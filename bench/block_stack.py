"""A launch-bound 12-layer transformer block stack (hidden 768) in every execution mode, on the GPU.

    python3 -m bench.block_stack                                   # 1x1 and 8x512, with torch.compile
    SHAPEPLAN_CACHE_DIR=$(mktemp -d) python3 -m bench.block_stack --shapes 1x1 --optimize --no-compile

Modes: shapeplan slot_by_slot, cuda_graphs, triton; eager torch on the same weights; and
torch.compile(mode="reduce-overhead"). Reports per-call latency (median of timed blocks of calls,
outputs copied out), time from sp.compile to the first replayed call (compile+capture, cold), capture
coverage (slots inside captured segments) and fused Triton steps. Prints a table; needs CUDA. "ready s"
of the triton row is the cold start of the backend when SHAPEPLAN_CACHE_DIR is a new empty directory,
the warm one when it holds an earlier run's kernels.

Block (llama-style, no KV cache):
    h = RMSNorm(x); q,k,v = h@Wq, h@Wk, h@Wv; q,k = RoPE(q), RoPE(k); a = Attention(q,k,v, causal)
    h2, r = SkipRMSNorm(a@Wo, x); x' = SiLU*mul(h2@Wgu) @ Wd + r
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch

import shapeplan as sp

HIDDEN, HEADS, FFN = 768, 12, 2048
OPTIMIZE = False      # the graph is built fused already; --optimize runs the pass pipeline too
TIMELINE = False      # --timeline: the triton engine's lifecycle/compile events with times (stderr)


def make_weights(layers: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    s = 1.0 / math.sqrt(HIDDEN)
    out = []
    for _ in range(layers):
        out.append({"n1": 1 + 0.1 * rng.standard_normal(HIDDEN), "n2": 1 + 0.1 * rng.standard_normal(HIDDEN),
                    "wq": s * rng.standard_normal((HIDDEN, HIDDEN)), "wk": s * rng.standard_normal((HIDDEN, HIDDEN)),
                    "wv": s * rng.standard_normal((HIDDEN, HIDDEN)), "wo": s * rng.standard_normal((HIDDEN, HIDDEN)),
                    "wgu": s * rng.standard_normal((HIDDEN, 2 * FFN)),
                    "wd": rng.standard_normal((FFN, HIDDEN)) / math.sqrt(FFN)})
    return out


def rope_tables(seq: int) -> tuple[np.ndarray, np.ndarray]:
    d = HIDDEN // HEADS
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    ang = np.outer(np.arange(seq), inv)                       # [S, D/2]
    return np.cos(ang), np.sin(ang)


def build_graph(weights: list[dict[str, np.ndarray]], batch: int, seq: int, dtype: str) -> sp.Graph:
    g = sp.Graph("blocks")
    x = g.placeholder("x", dtype, (batch, seq, HIDDEN))
    cos, sin = rope_tables(seq)
    c = g.constant(cos.astype(dtype), name="rope_cos")
    s_ = g.constant(sin.astype(dtype), name="rope_sin")
    pos = g.constant(np.broadcast_to(np.arange(seq), (batch, seq)).astype(np.int64).copy(), name="pos")
    for i, w in enumerate(weights):
        W = {k: g.constant(v.astype(dtype), name=f"l{i}.{k}") for k, v in w.items()}
        h = g.op.RMSNormalization(x, W["n1"], _domain="shapeplan", epsilon=1e-5)
        q, k, v = (g.op.MatMul(h, W[n]) for n in ("wq", "wk", "wv"))
        q = g.op.RotaryEmbedding(q, c, s_, pos, _domain="shapeplan", num_heads=HEADS)
        k = g.op.RotaryEmbedding(k, c, s_, pos, _domain="shapeplan", num_heads=HEADS)
        a = g.op.Attention(q, k, v, _domain="shapeplan", q_num_heads=HEADS, kv_num_heads=HEADS, is_causal=1)
        h2, r = g.op.SkipRMSNormalization(g.op.MatMul(a, W["wo"]), x, W["n2"], _domain="shapeplan",
                                          epsilon=1e-5, _outputs=2)
        act = g.op.SiluMul(g.op.MatMul(h2, W["wgu"]), _domain="shapeplan")
        x = g.op.Add(g.op.MatMul(act, W["wd"]), r)
    g.set_outputs(x)
    return g


class TorchBlocks(torch.nn.Module):
    """The same computation in plain torch (the eager and torch.compile baselines)."""

    def __init__(self, weights: list[dict[str, np.ndarray]], seq: int, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        t = lambda a: torch.tensor(np.asarray(a), dtype=dtype, device=device)  # noqa: E731
        self.w = [{k: t(v) for k, v in w.items()} for w in weights]
        cos, sin = rope_tables(seq)
        self.cos, self.sin = t(cos), t(sin)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:            # x [B, H, S, D]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((self.cos * x1 - self.sin * x2, self.sin * x1 + self.cos * x2), -1)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        for w in self.w:
            h = self._rms(x, w["n1"])
            q, k, v = ((h @ w[n]).view(b, s, HEADS, -1).transpose(1, 2) for n in ("wq", "wk", "wv"))
            a = torch.nn.functional.scaled_dot_product_attention(self._rope(q), self._rope(k), v, is_causal=True)
            r = a.transpose(1, 2).reshape(b, s, HIDDEN) @ w["wo"] + x
            gu = self._rms(r, w["n2"]) @ w["wgu"]
            x = (torch.nn.functional.silu(gu[..., :FFN]) * gu[..., FFN:]) @ w["wd"] + r
        return x


def timeit(fn, iters: int, blocks: int = 5) -> float:
    """Median seconds per call over ``blocks`` timed blocks of ``iters`` calls."""
    times = []
    for _ in range(blocks):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def coverage(engine) -> tuple[float, int]:
    info = engine.inspect()
    segs = info.segments
    total = sum(len(s["slots"]) for s in segs)
    captured = sum(len(s["slots"]) for s in segs if s.get("state") == "REPLAYING")
    fused = sum(s.get("capture", {}).get("fused_steps", 0) for s in segs)
    return (captured / total if total else 0.0), fused


def run_shape(weights, batch: int, seq: int, dtype: str, do_compile: bool, iters: int) -> list[dict]:
    tdt = getattr(torch, dtype)
    g = build_graph(weights, batch, seq, dtype)
    x = torch.randn(batch, seq, HIDDEN, device="cuda").to(tdt)
    rows = []
    ref = None
    for mode in ("slot_by_slot", "cuda_graphs", "triton"):
        torch.cuda.synchronize()
        if TIMELINE and mode == "triton":
            from shapeplan import diagnostics
            diagnostics.enable(categories=["LIFECYCLE", "SEGMENT", "GRAPH_REPLAY", "COMPILE", "FALLBACK", "VERIFY"],
                               level="detailed")
            diagnostics.record("LIFECYCLE", "t0")
        t0 = time.perf_counter()
        eng = sp.compile(g, device="cuda", mode=mode, optimize=OPTIMIZE)
        calls = 0
        while calls < 8:
            eng.run({"x": x})
            calls += 1
            if mode == "slot_by_slot" or eng.inspect().phase in ("REPLAYING", "REPLAY_BLOCKED"):
                break
        torch.cuda.synchronize()
        ready = time.perf_counter() - t0
        if TIMELINE and mode == "triton":
            from shapeplan import diagnostics
            evs = diagnostics.events()
            base = next(e.t for e in evs if e.message == "t0")
            for e in evs:
                f = {k: v for k, v in e.fields.items() if k in ("segment", "kernels", "reason", "kernel", "seconds",
                                                               "workers", "site", "compile_s", "launcher_s",
                                                               "sent_at_s", "spawn_s")}
                print(f"  {1000 * (e.t - base):8.1f} ms  {e.category:<12} {e.message}  {f}", file=sys.stderr)
            print(f"  {1000 * ready:8.1f} ms  (first replayed call done)", file=sys.stderr)
            diagnostics.disable()
        it = max(3, iters // 20) if mode == "slot_by_slot" else iters
        lat = timeit(lambda: eng.run({"x": x}), it)
        cov, fused = coverage(eng) if mode != "slot_by_slot" else (0.0, 0)
        out = eng.run({"x": x})[eng.output_names[0]].float()
        if ref is None:
            ref = out
        err = float((out - ref).norm() / ref.norm())
        info = eng.inspect()
        rows.append({"shape": f"{batch}x{seq}", "mode": mode, "ms": lat * 1e3, "ready_s": ready,
                     "calls_to_replay": calls, "coverage": cov, "fused_steps": fused, "phase": info.phase,
                     "pool_MB": sum(p.get("graph_pool_bytes", 0) for p in info.plans()) / 2 ** 20,
                     "rel_err_vs_slot": err})
        del eng
    model = TorchBlocks(weights, seq, tdt, "cuda")
    with torch.no_grad():
        eo = model(x).float()
        rows.append({"shape": f"{batch}x{seq}", "mode": "eager torch", "ms": timeit(lambda: model(x), iters) * 1e3,
                     "ready_s": 0.0, "rel_err_vs_slot": float((eo - ref).norm() / ref.norm())})
        if do_compile:
            torch._dynamo.reset()
            cm = torch.compile(model, mode="reduce-overhead")
            t0 = time.perf_counter()
            for _ in range(3):
                co = cm(x)
            torch.cuda.synchronize()
            ready = time.perf_counter() - t0
            lat = timeit(lambda: cm(x).clone(), iters)
            rows.append({"shape": f"{batch}x{seq}", "mode": "torch.compile reduce-overhead", "ms": lat * 1e3,
                         "ready_s": ready, "rel_err_vs_slot": float((co.float() - ref).norm() / ref.norm())})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.block_stack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--shapes", default="1x1,8x512", help="comma-separated BATCHxSEQ (default 1x1,8x512)")
    ap.add_argument("--iters", type=int, default=200, help="calls per timed block (a tenth for large shapes)")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile row (~10 s per shape)")
    ap.add_argument("--json", default="", help="write the rows as JSON to this file")
    ap.add_argument("--optimize", action="store_true", help="run the optimizer's passes too (optimize=True)")
    ap.add_argument("--timeline", action="store_true",
                    help="print the triton engine's lifecycle/compile events with their times (stderr)")
    a = ap.parse_args()
    global OPTIMIZE, TIMELINE
    OPTIMIZE, TIMELINE = a.optimize, a.timeline
    if not torch.cuda.is_available():
        print("bench.block_stack: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return
    weights = make_weights(a.layers)
    rows = []
    for shp in a.shapes.split(","):
        b, s = map(int, shp.split("x"))
        rows += run_shape(weights, b, s, a.dtype, not a.no_compile, a.iters if b * s < 64 else max(20, a.iters // 10))
    base = {r["shape"]: r["ms"] for r in rows if r["mode"] == "slot_by_slot"}
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__} layers={a.layers} dtype={a.dtype}")
    print(f"{'shape':>6} {'mode':<30} {'ms/call':>9} {'vs slot':>8} {'ready s':>8} {'coverage':>8} "
          f"{'fused':>5} {'pool MB':>8} {'rel err':>9}")
    for r in rows:
        print(f"{r['shape']:>6} {r['mode']:<30} {r['ms']:9.3f} {base[r['shape']] / r['ms']:7.1f}x "
              f"{r.get('ready_s', 0):8.2f} {r.get('coverage', 0) * 100:7.0f}% {r.get('fused_steps', 0):5d} "
              f"{r.get('pool_MB', 0):8.1f} {r['rel_err_vs_slot']:9.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
