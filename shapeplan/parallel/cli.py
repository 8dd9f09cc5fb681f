"""``shapeplan generate --tp N`` and ``shapeplan bench --tp N``: spawn N workers (one per device; gloo
on CPU, NCCL on CUDA), rank 0 tokenizes and prints. The commands call these when ``--tp`` > 1."""
from __future__ import annotations

import argparse
import json
import sys

from shapeplan.parallel.launch import spawn


def generate(args: argparse.Namespace, chat_template: str | None = None) -> int:
    from shapeplan.parallel.run import generate_worker
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty, seed=args.seed,
                    presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, min_p=args.min_p)
    opts = {"chat": args.chat, "max_new_tokens": args.max_new_tokens, "sampling": sampling,
            "chat_template": chat_template}
    pipe_kw = {"mode": args.mode, "dtype": args.dtype, "max_prefill_length": args.max_prefill_length,
               "max_kv_cache_length": args.max_kv_cache_length}
    out = spawn(generate_worker, args.tp, args.model, args.prompt, opts, pipe_kw, device=args.device,
                threads=_threads(args))
    res = out[0]
    if args.metrics and res is not None:
        print(f"[tp={args.tp}: {len(res['token_ids'])} tokens, finish={res['finish_reason']}, "
              f"TTFT {res['ttft_s'] * 1e3:.1f} ms, decode {res['decode_tok_s']:.1f} tok/s, "
              f"late_steady {res['late_steady_tok_s']:.1f} tok/s, effective {res['effective_tok_s']:.1f} tok/s]",
              file=sys.stderr)
    return 0


def bench(args: argparse.Namespace, configs: list[str]) -> int:
    from shapeplan.llm.bench import BenchRow, format_table
    from shapeplan.parallel.run import bench_worker
    source = {"preset": args.preset, "model": args.model, "dtype": args.dtype}
    opts = {"prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
            "max_kv_cache_length": args.max_kv_cache_length, "optimize": not args.no_optimize}
    rows_d = spawn(bench_worker, args.tp, source, configs, opts, device=args.device, threads=_threads(args))[0]
    rows = []
    for d in rows_d:
        tokens = d.pop("tokens")
        rows.append(BenchRow(**d, tokens=tokens))
    if len(rows) > 1 and rows[0].ok:
        from shapeplan.llm.bench import agreement
        for r in rows[1:]:
            if r.ok:
                r.agree_with_reference = agreement(r.tokens, rows[0].tokens)
    name = args.preset or args.model
    print(format_table(rows, f"{name} on {args.device} x{args.tp} (tensor parallel), prompt {args.prompt_len}, "
                             f"{args.new_tokens} new tokens, greedy"))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"model": name, "device": args.device, "tp": args.tp, "prompt_len": args.prompt_len,
                       "new_tokens": args.new_tokens, "rows": [r.to_dict() for r in rows]}, f, indent=2)
    return 1 if any(not r.ok for r in rows) else 0


def _threads(args: argparse.Namespace) -> int:
    """CPU workers share the cores: give each an equal part (CUDA workers: torch's default)."""
    import os

    import torch
    if torch.device(args.device).type == "cuda":
        return 0
    return max(1, (os.cpu_count() or 1) // args.tp)
