"""``shapeplan bench``: decode throughput of a preset or a checkpoint per execution config.

    shapeplan bench --preset llama-1b --config matrix --device cuda --json out.json
    shapeplan bench --preset llama-1b --config triton --device cuda --vs-torch-compile
    shapeplan bench --preset llama-1b --quantize Q4_K_M --config auto --device cuda
    shapeplan bench --model llama-1b-Q4_K_M.gguf --config auto --device cuda --dtype bfloat16
    shapeplan bench --serve http://127.0.0.1:8000 --concurrency 1,8,32,64,128     # a running server, over HTTP
"""
from __future__ import annotations

import argparse
import json
import sys
import time


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
    srv = p.add_argument_group("serving (many requests through the batched engine)")
    srv.add_argument("--batch", type=int, default=0, metavar="N",
                     help="serving benchmark: N requests at once through the batched engine (max_num_seqs = N)")
    srv.add_argument("--requests", type=int, default=0,
                     help="requests in all (default: --batch); with --serve, per run (default: max(4, 2 x clients))")
    srv.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (default: all at once)")
    srv.add_argument("--shared-prefix", type=int, default=0, help="tokens of a system prompt every request shares")
    srv.add_argument("--no-prefix-cache", action="store_true", help="turn the block prefix cache off")
    srv.add_argument("--sweep", default="", help="concurrencies to sweep, e.g. 1,8,32,64,128 (writes a plot)")
    srv.add_argument("--plot", default=None, help="PNG of the sweep (default: next to --json, or sweep.png)")
    srv.add_argument("--launch-ahead", action="store_true",
                     help="async rounds for every round: launch each decode round before the previous one is read "
                          "back, the CPU too (without it, SHAPEPLAN_LAUNCH_AHEAD decides: by default every round on a GPU)")
    srv.add_argument("--vs-hf", action="store_true",
                     help="also run transformers' continuous batching (generate_batch) on the same weights")
    http = p.add_argument_group("HTTP load (streaming clients against a running shapeplan serve; docs/serve.md)")
    http.add_argument("--serve", metavar="URL", default=None,
                      help="benchmark the OpenAI-compatible server at URL (uses --prompt-len, --new-tokens, --requests)")
    http.add_argument("--concurrency", default="1,8,32,64,128", help="concurrent streaming clients per run")
    http.add_argument("--api-key", default=None, help="the server's API key")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    if args.serve:
        return _http(args)
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
    if args.batch or args.sweep:
        return _serving(args, cfg, quantized(cfg, weights, args.quantize), name)
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


def _tensors(v) -> list[torch.Tensor]:  # noqa: ANN001 - a weight as the loader gives it
    """The device tensors holding one weight: itself, a quantized weight's packed bytes, or a reference
    int4 weight's parts."""
    import torch
    from shapeplan.quant.formats import QuantWeight
    if isinstance(v, torch.Tensor):
        return [v]
    return [v.packed] if isinstance(v, QuantWeight) else v.tensors()


def _serving(args: argparse.Namespace, cfg, weights, name: str) -> int:  # noqa: ANN001
    import torch

    from shapeplan.llm.bench_serving import format_rows, hf_serving, make_prompts, plot_sweep, run_serving
    from shapeplan.llm.pipeline import GenerationPipeline
    sweep = [int(x) for x in args.sweep.split(",") if x.strip()] if args.sweep else []
    most = max(sweep + [args.batch, 1])
    n_req = args.requests or args.batch or most
    emb = weights["model.embed_tokens.weight"]
    dtype = emb.dtype if isinstance(emb, torch.Tensor) else getattr(torch, cfg.dtype)
    mode = "auto" if args.config == "matrix" else args.config
    length = max(args.max_kv_cache_length, args.shared_prefix + args.prompt_len + args.new_tokens + 16)
    prefill = max(16, min(2048, args.shared_prefix + args.prompt_len))
    t0 = time.perf_counter()
    pipe = GenerationPipeline(cfg, weights, None, device=args.device, mode=mode, dtype=dtype, max_num_seqs=most,
                              max_prefill_length=prefill, max_kv_cache_length=length, eos_token_ids=[],
                              prefix_cache=not args.no_prefix_cache, optimize=not args.no_optimize)
    if args.launch_ahead:
        pipe.batch.launch_ahead = True
    cuda = pipe.device.type == "cuda"
    # the captured plans' memory: their CUDA graphs' memory pools, from the allocator's snapshot. A difference of
    # memory_reserved around the captures is not it: blocks freed meanwhile (--quantize's float weights, a GGUF
    # load's file layouts) are released when torch.cuda.graph empties the cache, and read -576 MiB for llama-8b
    # Q4_K_M (H100, thirtieth session) where the pools held 22 MiB
    pools = (lambda: 0)
    if cuda:
        from shapeplan.runtime.backends.cuda_graphs import graph_pools_reserved
        pools = lambda: graph_pools_reserved(pipe.device)  # noqa: E731
    before = pools()
    pipe.batch.call(lambda: [pipe.runner.settle("next_token", b, 1) for b in pipe.decode_buckets])
    decode_plans = pools() - before
    pipe.warmup(sampled=False)                                    # the packed prefill plans too
    warm = make_prompts(cfg.vocab_size, min(most, 8), args.prompt_len, seed=99)
    run_serving(pipe, warm, 8)                                     # every bucket has replayed once
    pipe.clear_prefix_cache()
    plans = pools() - before
    tensors = [t for v in weights.values() for t in _tensors(v)]
    weight_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())
    gib = 2 ** 30
    print(f"  ready in {time.perf_counter() - t0:.1f} s (load, compile, capture of {len(pipe.decode_buckets)} "
          f"decode buckets); KV pool {pipe.kv_cache_bytes / gib:.2f} GiB; weights {weight_bytes / gib:.2f} GiB; "
          f"CUDA graph memory of the captured greedy decode plans of every bucket {decode_plans / 2**20:.0f} MiB "
          f"({100 * decode_plans / max(1, weight_bytes):.2f} % of the weights); with the prefill plans "
          f"{plans / 2**20:.0f} MiB ({100 * plans / max(1, weight_bytes):.1f} %)", file=sys.stderr)
    rows = []
    points = sweep or [n_req]
    for c in points:
        prompts = make_prompts(cfg.vocab_size, c if sweep else n_req, args.prompt_len, args.shared_prefix)
        row = run_serving(pipe, prompts, args.new_tokens, rate=args.rate)
        row.concurrency = min(c, most)
        rows.append(row)
        pipe.clear_prefix_cache()
        print(f"  {c}: {row.output_tok_s:.0f} tok/s", file=sys.stderr)
    if args.vs_hf:
        print("  running transformers generate_batch ...", file=sys.stderr)
        prompts = make_prompts(cfg.vocab_size, n_req, args.prompt_len, args.shared_prefix)
        hf = hf_serving(cfg, weights, prompts, args.new_tokens, args.device, dtype)
        hf.concurrency = n_req
        rows.append(hf)
    title = (f"{name} on {args.device}: {n_req if not sweep else 'sweep'} requests x {args.prompt_len} prompt "
             f"(+{args.shared_prefix} shared) x {args.new_tokens} new tokens, EOS ignored, "
             f"{'Poisson %.1f/s' % args.rate if args.rate else 'all at once'}")
    print(format_rows(rows, title))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"model": name, "device": args.device, "rows": [r.to_dict() for r in rows],
                       "kv_cache_bytes": pipe.kv_cache_bytes, "decode_buckets": pipe.decode_buckets,
                       "plan_memory_bytes": plans, "decode_plan_memory_bytes": decode_plans,
                       "weight_bytes": weight_bytes}, f, indent=2)
    if sweep:
        import os
        path = args.plot or (os.path.splitext(args.json_path)[0] + ".png" if args.json_path else "sweep.png")
        if plot_sweep(rows, path, title):
            print(f"  plot: {path}", file=sys.stderr)
    return 0 if all(r.ok for r in rows if r.name == "shapeplan") else 1


def _http(args: argparse.Namespace) -> int:
    try:
        import httpx  # noqa: F401
    except ImportError:
        print("error: bench --serve needs httpx (the serve extra): pip install -e \".[serve]\"", file=sys.stderr)
        return 1
    from shapeplan.llm.bench_serving import plot_sweep
    from shapeplan.serve.openai import loadgen
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    rows = loadgen.run(args.serve, levels, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                       requests=args.requests, api_key=args.api_key, log=lambda s: print(s, file=sys.stderr))
    model = rows[0].extra["model"] if rows else "?"
    title = (f"{model} at {args.serve}: streaming clients, {args.prompt_len}-token random prompts, "
             f"{args.new_tokens} new tokens, greedy, EOS ignored")
    print(loadgen.format_table(rows, title))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"url": args.serve, "model": model, "prompt_len": args.prompt_len,
                       "new_tokens": args.new_tokens, "rows": [r.to_dict() for r in rows]}, f, indent=2)
    import os
    path = args.plot or (os.path.splitext(args.json_path)[0] + ".png" if args.json_path else "serve_sweep.png")
    if plot_sweep(rows, path, title, xlabel="concurrent streaming clients"):
        print(f"  plot: {path}", file=sys.stderr)
    else:
        print("  no plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    return 0 if all(r.ok for r in rows) else 1
