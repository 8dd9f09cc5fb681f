"""Where a fresh process's first slot-by-slot calls spend their time (start-up probe).

    SHAPEPLAN_CACHE_DIR=/tmp/c python bench/gpu_slot_times.py [--top 15]

Builds the llama-1b pipeline (triton mode) and times every slot of the plans' slot-by-slot calls of the
first request (a device sync after each slot), printing the slowest slots with the time since the
start and the total per op type. Slots are timed only while they run slot by slot (recording and
warm-up calls); the sync per slot adds a little to every one.
"""
from __future__ import annotations

import argparse
import collections
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
from shapeplan.runtime import runner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    cfg = preset_config(a.preset, "bfloat16")
    w = random_weights(cfg, device="cuda", seed=0)
    prompt = bench_prompt(cfg.vocab_size, 128)
    torch.cuda.synchronize()
    rows: list[tuple[float, float, str, int]] = []
    original = runner.run_slot
    t0 = time.perf_counter()

    def timed(slot, regs):  # noqa: ANN001, ANN202
        s = time.perf_counter()
        original(slot, regs)
        torch.cuda.synchronize()
        e = time.perf_counter()
        rows.append((e - s, s - t0, slot.op_type, slot.index))

    runner.run_slot = timed
    pipe = GenerationPipeline(cfg, w, None, device="cuda", mode="triton", dtype=torch.bfloat16,
                              max_prefill_length=128, max_kv_cache_length=1024, sync_every=16, eos_token_ids=[])
    t1 = time.perf_counter()
    pipe.generate(prompt, max_new_tokens=32, sampling=Sampling.greedy())
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    runner.run_slot = original
    print(f"constructed {1e3 * (t1 - t0):.0f} ms, first request done {1e3 * (t2 - t0):.0f} ms, "
          f"{len(rows)} slot runs timed, {1e3 * sum(r[0] for r in rows):.0f} ms in them")
    for dt, at, op, idx in sorted(rows, reverse=True)[:a.top]:
        print(f"  {1e3 * dt:8.1f} ms  at {1e3 * at:7.0f} ms  slot {idx:4d}  {op}")
    per = collections.defaultdict(float)
    for dt, _, op, _ in rows:
        per[op] += dt
    print("  per op type: " + ", ".join(f"{op} {1e3 * t:.0f}" for op, t in sorted(per.items(), key=lambda x: -x[1])[:12]))


if __name__ == "__main__":
    main()
