"""``shapeplan bench``: decode throughput of a preset or a checkpoint per execution config.

    shapeplan bench --preset llama-1b --config matrix --device cuda --json out.json
    shapeplan bench --preset llama-1b --config triton --device cuda --vs-torch-compile
    shapeplan bench --preset llama-1b --quantize Q4_K_M --config auto --device cuda
    shapeplan bench --model llama-1b-Q4_K_M.gguf --config auto --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from shapeplan.llm.bench import CONFIGS
    from shapeplan.llm.config import PRESETS
    p = sub.add_parser("bench", help="LLM decode benchmark (TTFT, overall/decode/steady/late_steady tok/s)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=sorted(PRESETS), help="random weights with a public model's shapes")
    src.add_argument("--model", help="checkpoint directory or GGUF file (its quantized matrices stay packed)")
    p.add_argument("--config", default="auto", choices=CONFIGS + ["matrix"],
                   help="execution config; matrix runs every one available and checks each against slot_by_slot")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 for presets, the checkpoint's otherwise")
    p.add_argument("--quantize", default=None, metavar="TYPE",
                   help="quantize the weights at load as `shapeplan quantize` does: int8, int4, Q4_K_M, Q8_0, Q4_0, ...")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--max-kv-cache-length", type=int, default=1024)
    p.add_argument("--no-optimize", action="store_true", help="compile without the optimizer passes")
    p.add_argument("--json", dest="json_path", default=None, help="write the results as JSON to this file")
    p.add_argument("--vs-torch-compile", action="store_true",
                   help="also run a gpt-fast-style PyTorch decoder on the same weights in this process: eager, "
                        "and on CUDA eager + CUDA graph and torch.compile(mode='reduce-overhead')")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel: N processes, one per device (docs/parallel.md)")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from shapeplan.llm.bench import (bench_prompt, configs_for, format_table, load_model, quantized, run_matrix,
                                     torch_baselines)
    if not args.preset and not args.model:
        args.preset = "llama-125m"
    configs = configs_for(args.device) if args.config == "matrix" else [args.config]
    if args.tp > 1:
        from shapeplan.parallel.cli import bench
        return bench(args, configs)
    cfg, weights = load_model(args.preset, args.model, args.device, args.dtype)
    name = (args.preset or args.model) + (f" {args.quantize}" if args.quantize else "")
    rows = run_matrix(cfg, quantized(cfg, weights, args.quantize), configs, device=args.device, prompt_len=args.prompt_len,
                      new_tokens=args.new_tokens, max_kv_cache_length=args.max_kv_cache_length,
                      optimize=not args.no_optimize, log=lambda s: print(s, file=sys.stderr))
    if args.vs_torch_compile:
        ref = next((r.tokens for r in rows if r.config == "slot_by_slot" and r.ok), None)
        print("  running the PyTorch decoder ...", file=sys.stderr)
        rows += torch_baselines(cfg, weights, bench_prompt(cfg.vocab_size, args.prompt_len), args.new_tokens,
                                args.max_kv_cache_length, ref, device=args.device)
    print(format_table(rows, f"{name} on {args.device}, prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy"))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"model": name, "device": args.device, "prompt_len": args.prompt_len,
                       "new_tokens": args.new_tokens, "rows": [r.to_dict() for r in rows]}, f, indent=2)
    ours = [r for r in rows if not r.config.startswith("torch")]       # the PyTorch rows inform only
    failed = [r for r in ours if not r.ok]
    diverged = [r for r in ours if r.agree_with_reference not in ("-", f"{len(r.tokens)}/{len(r.tokens)}")]
    return 1 if failed or (args.device == "cpu" and diverged) else 0
