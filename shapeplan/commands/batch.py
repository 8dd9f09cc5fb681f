"""``shapeplan batch``: a file of OpenAI Batch API requests answered offline by the batched engine.

    shapeplan batch --model DIR|FILE.gguf -i requests.jsonl -o results.jsonl [--max-num-seqs 64]
    shapeplan batch --preset llama-1b --device cuda -i requests.jsonl -o -      # answers on stdout

Each input line: {"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions" |
"/v1/responses", "body": {...}}; each output line, in the same order: {"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"} (docs/serve.md, "Offline batches").
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    from shapeplan.serve.openai.server import add_llm_arguments
    p = sub.add_parser("batch", help="answer a JSONL file of OpenAI Batch API requests offline (batched engine)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--input", required=True, metavar="FILE.jsonl", help="the requests ('-': stdin)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.jsonl", help="the answers ('-': stdout)")
    p.add_argument("--model", metavar="DIR|FILE.gguf", help="a Hugging Face checkpoint directory or a GGUF file")
    p.add_argument("--preset", metavar="NAME", help="random weights with a public model's shapes (benchmarks)")
    add_llm_arguments(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default="auto")
    p.add_argument("--in-flight", type=int, default=None, metavar="N",
                   help="requests sent to the engine at once (default: twice --max-num-seqs)")
    p.add_argument("--max-request-bytes", type=int, default=None, help="largest request body (default 8 MiB)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        import fastapi, httpx, prometheus_client  # noqa: E401,F401 - the serve extra, checked up front
    except ImportError as e:
        print(f"error: shapeplan batch needs the serve extra ({e.name} is missing): pip install -e \".[serve]\"",
              file=sys.stderr)
        return 1
    from shapeplan.llm.config import PRESETS
    if bool(args.model) == bool(args.preset):
        print("error: give --model DIR|FILE.gguf or --preset NAME (one of them)", file=sys.stderr)
        return 2
    if args.model and not os.path.exists(args.model):
        print(f"error: --model {args.model}: no such checkpoint directory or GGUF file", file=sys.stderr)
        return 2
    if args.preset and args.preset not in PRESETS:
        print(f"error: --preset {args.preset}: no such preset (there are {', '.join(sorted(PRESETS))})", file=sys.stderr)
        return 2
    try:
        src = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    except OSError as e:
        print(f"error: --input {args.input}: {e.strerror}", file=sys.stderr)
        return 2
    with src:
        lines = [line for line in src.read().splitlines() if line.strip()]
    from shapeplan.serve.openai import DEFAULT_MAX_REQUEST_BYTES
    from shapeplan.serve.openai.batch import models_named, run_batch
    from shapeplan.serve.openai.server import build_openai_app, load_pipeline
    named = models_named(lines)
    name = args.served_model_name or (next(iter(named)) if len(named) == 1 else None) or \
        (args.preset or os.path.basename(os.path.normpath(args.model)))
    t0 = time.perf_counter()
    print(f"loading {args.preset or args.model} on {args.device} ...", file=sys.stderr, flush=True)
    pipe = load_pipeline(args)
    try:
        pipe.warmup()
        print(f"  ready in {time.perf_counter() - t0:.1f} s; {len(lines)} requests for '{name}'", file=sys.stderr,
              flush=True)
        app = build_openai_app(pipe, model_name=name,
                               checkpoint=args.model if args.model and os.path.isdir(args.model) else None,
                               max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
                               reasoning_parser=args.reasoning_parser)
        with contextlib.ExitStack() as stack:
            out = sys.stdout if args.output == "-" else stack.enter_context(open(args.output, "w", encoding="utf-8"))
            report = asyncio.run(run_batch(app, lines, out, in_flight=args.in_flight or 2 * args.max_num_seqs))
    finally:
        pipe.close()
    print(report.summary(), file=sys.stderr)
    for e in report.errors:
        print(f"  {e}", file=sys.stderr)
    return 0
