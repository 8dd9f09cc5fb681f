"""LLM decode throughput on the GPU: shapeplan's pipeline per execution mode vs a gpt-fast-style PyTorch
decoder with the SAME weights (eager, eager + one CUDA graph per step, torch.compile reduce-overhead),
all in one process. Presets have random bf16 weights; greedy decode, prompt 128, 256 new tokens.

    python bench/gpu_decode.py                               # llama-1b and llama-8b, our modes only
    python bench/gpu_decode.py --vs-torch-compile --json decode.json
    python bench/gpu_decode.py --presets llama-125m --configs slot_by_slot,cuda_graphs

Reported per row: late_steady tok/s (decode steps >= 20), decode tok/s, TTFT, cold start (ours:
pipeline construction + a 32-token warm-up request; torch: warm-up/capture/compile of the step), and
token agreement with our slot_by_slot run (bf16 greedy picks can diverge after near-ties; see
GPU_NOTES.md, so agreement is informative, not a pass/fail).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shapeplan.llm.bench import bench_prompt, format_table, run_matrix, torch_baselines
from shapeplan.llm.config import preset_config
from shapeplan.llm.weights import random_weights


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="llama-1b,llama-8b")
    ap.add_argument("--configs", default="slot_by_slot,emulated_replay,cuda_graphs,triton,auto",
                    help="our execution modes to run (unavailable ones are reported as failed rows)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-kv-cache-length", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--vs-torch-compile", action="store_true",
                    help="also run the PyTorch baselines (eager, eager + CUDA graph, torch.compile)")
    ap.add_argument("--no-optimize", action="store_true", help="compile our graph without the optimizer passes")
    ap.add_argument("--decode-attention", default="auto", choices=["auto", "sdpa", "triton"],
                    help="our decode attention: the Triton split-K kernel (auto on CUDA) or SDPA over the cache")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: this benchmark needs a GPU", file=sys.stderr)
        return 2
    from shapeplan.ops.llm import set_decode_attention
    set_decode_attention(args.decode_attention)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "prompt_len": args.prompt_len,
               "new_tokens": args.new_tokens, "max_kv_cache_length": args.max_kv_cache_length,
               "decode_attention": args.decode_attention, "models": {}}
    for preset in [p for p in args.presets.split(",") if p]:
        cfg = preset_config(preset, args.dtype)
        t = time.perf_counter()
        weights = random_weights(cfg, device="cuda", seed=0)
        gb = sum(w.numel() * w.element_size() for w in weights.values()) / 1e9
        print(f"\n{preset}: {gb:.2f} GB of {args.dtype} weights (made in {time.perf_counter() - t:.1f} s)",
              file=sys.stderr)
        configs = [c for c in args.configs.split(",") if c]
        rows = run_matrix(cfg, weights, configs, device="cuda", prompt_len=args.prompt_len,
                          new_tokens=args.new_tokens, max_kv_cache_length=args.max_kv_cache_length,
                          optimize=not args.no_optimize, log=lambda s: print(s, file=sys.stderr))
        if args.vs_torch_compile:
            ref = next((r.tokens for r in rows if r.config == "slot_by_slot" and r.ok), None)
            rows += torch_baselines(cfg, weights, bench_prompt(cfg.vocab_size, args.prompt_len), args.new_tokens,
                                    args.max_kv_cache_length, ref)
        floor = 4.23e12 / (gb * 1e9)          # tok/s if every step only streamed the weights (GPU_NOTES.md)
        print(format_table(rows, f"\n{preset} ({gb:.2f} GB, bandwidth floor ~{floor:,.0f} tok/s), "
                                 f"prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy, {args.dtype}"))
        results["models"][preset] = {"weights_gb": gb, "rows": [r.to_dict() for r in rows]}
        del weights
        gc.collect()
        torch.cuda.empty_cache()
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
