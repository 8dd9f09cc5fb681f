"""Where a decode step's GPU time goes: the pipeline's decode plan (segments, steps, fused steps) and a
torch.profiler kernel table over N greedy decode tokens.

    python bench/gpu_decode_profile.py --preset llama-1b --mode triton --tokens 64
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shapeplan.llm.bench import bench_prompt  # noqa: E402
from shapeplan.llm.config import preset_config  # noqa: E402
from shapeplan.llm.pipeline import GenerationPipeline  # noqa: E402
from shapeplan.llm.sampling import Sampling  # noqa: E402
from shapeplan.llm.weights import random_weights  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--mode", default="triton")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args()
    cfg = preset_config(a.preset, "bfloat16")
    w = random_weights(cfg, device="cuda", seed=0)
    wbytes = sum(t.numel() * t.element_size() for t in w.values())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    pipe = GenerationPipeline(cfg, w, None, device="cuda", mode=a.mode, dtype=torch.bfloat16,
                              max_prefill_length=128, max_kv_cache_length=1024, sync_every=16, eos_token_ids=[])
    prompt = bench_prompt(cfg.vocab_size, 128)
    pipe.generate(prompt, max_new_tokens=32, sampling=Sampling.greedy())
    torch.cuda.synchronize()
    print(f"cold start {time.perf_counter() - t0:.2f} s; memory beyond weights "
          f"{(torch.cuda.memory_allocated() - base) / 1e6:.0f} MB allocated, "
          f"{torch.cuda.memory_reserved() / 1e6:.0f} MB reserved; weights {wbytes / 1e6:.0f} MB")
    for r in pipe.engine.runners():
        segs = [(s.ctx.segment.index, s.state.value, len(s.ctx.slots),
                 getattr(s.handle, "stats", lambda: {})().get("fused_steps"), s.reason[:120]) for s in r.segments]
        print(r.name, r.key[1], r.phase.value, segs)
    res = pipe.generate(prompt, max_new_tokens=a.tokens, sampling=Sampling.greedy())
    print(f"late_steady {res.metrics.late_steady_tok_s:.1f} tok/s")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        pipe.generate(prompt, max_new_tokens=a.tokens, sampling=Sampling.greedy())
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=a.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
