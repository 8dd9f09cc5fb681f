"""Start-up time and memory of the LLM pipeline on the GPU, weights excluded (issue 7).

    SHAPEPLAN_CACHE_DIR=/tmp/c python bench/gpu_startup.py --preset llama-1b --mode triton   # cold
    SHAPEPLAN_CACHE_DIR=/tmp/c python bench/gpu_startup.py --preset llama-1b --mode triton   # warm

Random weights are made on the GPU first (not timed); then the clock runs over pipeline construction
and a 32-token warm-up request (so the prefill and decode plans are built and captured), exactly what
`bench/gpu_decode.py` calls "cold start". Memory beyond weights = torch.cuda.memory_allocated() after
the warm-up minus before construction (the KV cache is part of it). ``--cprofile N`` prints the N
most expensive functions (cumulative) of the timed region. Prints one JSON line last.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapeplan.llm.bench import bench_prompt  # noqa: E402
from shapeplan.llm.config import preset_config  # noqa: E402
from shapeplan.llm.pipeline import GenerationPipeline  # noqa: E402
from shapeplan.llm.sampling import Sampling  # noqa: E402
from shapeplan.llm.weights import random_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--mode", default="triton")
    ap.add_argument("--max-prefill-length", type=int, default=128)
    ap.add_argument("--max-kv-cache-length", type=int, default=1024)
    ap.add_argument("--cprofile", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--step-times", action="store_true",
                    help="print the slowest steps (host time) of the eager runs before the captures")
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="set SHAPEPLAN_STARTUP_SWITCH_INTERVAL (0: the default)")
    ap.add_argument("--sample", action="store_true",
                    help="sample the main thread's stack every ms; print where construction and the first request went")
    ap.add_argument("--timeline", action="store_true",
                    help="print the lifecycle/compile/capture events of the timed region with their times")
    a = ap.parse_args()
    if a.switch_interval:
        os.environ["SHAPEPLAN_STARTUP_SWITCH_INTERVAL"] = repr(a.switch_interval)
    cfg = preset_config(a.preset, "bfloat16")
    w = random_weights(cfg, device="cuda", seed=0)
    wbytes = sum(t.numel() * t.element_size() for t in w.values())
    prompt = bench_prompt(cfg.vocab_size, 128)
    import shapeplan  # noqa: F401  (import time is not start-up of a pipeline)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    prof = cProfile.Profile() if a.cprofile else None
    if a.timeline:
        from shapeplan import diagnostics
        diagnostics.enable(categories=["LIFECYCLE", "SEGMENT", "GRAPH_REPLAY", "COMPILE", "CACHE", "FALLBACK",
                                       "VERIFY", "FUSION"], level="detailed")
        diagnostics.record("LIFECYCLE", "t0")
    step_times: list[tuple[float, str]] = []
    if a.step_times:                 # host time of each step of the eager run before a capture
        from shapeplan.runtime.backends.triton import backend as triton_backend
        inner = triton_backend.run_steps

        def timed(steps, regs):  # noqa: ANN001, ANN202
            s0 = time.perf_counter()
            inner(steps, regs)
            if len(steps) == 1:
                step_times.append((time.perf_counter() - s0, steps[0].describe()))
        triton_backend.run_steps = timed
    sampler = None
    if a.sample:
        from stack_sampler import StackSampler
        sampler = StackSampler().start()
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    pipe = GenerationPipeline(cfg, w, None, device="cuda", mode=a.mode, dtype=torch.bfloat16,
                              max_prefill_length=a.max_prefill_length, max_kv_cache_length=a.max_kv_cache_length,
                              sync_every=16, eos_token_ids=[])
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    pipe.generate(prompt, max_new_tokens=32, sampling=Sampling.greedy())
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    if prof:
        prof.disable()
    extra = torch.cuda.memory_allocated() - base
    if step_times:
        print(f"eager-run steps: {len(step_times)}, host {1000 * sum(t for t, _ in step_times):.1f} ms; slowest:")
        for t, d in sorted(step_times, reverse=True)[:15]:
            print(f"  {1000 * t:7.2f} ms  {d[:110]}")
    if sampler is not None:
        sampler.stop()
        print("construction:\n" + sampler.report(t0, t1, top=30))
        print("first request:\n" + sampler.report(t1, t2, top=30))
    if a.timeline:
        from shapeplan import diagnostics
        evs = diagnostics.events()
        base_t = next(e.t for e in evs if e.message == "t0")
        for e in evs:
            f = {k: v for k, v in e.fields.items() if k in ("plan", "segment", "kernels", "reason", "state", "kernel", "seconds", "workers", "site", "nodes", "outputs", "tokens", "key")}
            print(f"  {1000 * (e.t - base_t):8.1f} ms  {e.category:<12} {e.message}  {f}")
        from shapeplan.llm import warmup
        for name, a0, a1 in warmup.timings:
            print(f"  warm-up part {name:<12} {1000 * (a0 - t0):8.1f} -> {1000 * (a1 - t0):8.1f} ms")
        print(f"  {1000 * (t1 - t0):8.1f} ms  (constructed)   {1000 * (t2 - t0):8.1f} ms  (first request done)")
    res = pipe.generate(prompt, max_new_tokens=64, sampling=Sampling.greedy())
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(a.cprofile)
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.cprofile // 2)
        print(s.getvalue())
    out = {"label": a.label, "preset": a.preset, "mode": a.mode, "construct_s": round(t1 - t0, 3),
           "first_request_s": round(t2 - t1, 3), "start_s": round(t2 - t0, 3),
           "extra_mb": round(extra / 1e6, 1), "weights_mb": round(wbytes / 1e6, 1),
           "extra_pct_of_weights": round(100 * extra / wbytes, 2),
           "reserved_mb": round(torch.cuda.memory_reserved() / 1e6, 1),
           "late_steady_64": round(res.metrics.late_steady_tok_s, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
