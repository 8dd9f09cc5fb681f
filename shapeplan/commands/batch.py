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
import sys


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
    from shapeplan.serve.openai.server import check_llm_args, openai_app
    problem = check_llm_args(args) if (args.model or args.preset) else \
        "give --model DIR|FILE.gguf or --preset NAME (one of them)"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        src = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    except OSError as e:
        print(f"error: --input {args.input}: {e.strerror}", file=sys.stderr)
        return 2
    with src:
        lines = [line for line in src.read().splitlines() if line.strip()]
    from shapeplan.serve.openai.batch import models_named, run_batch
    named = models_named(lines)
    if not args.served_model_name and len(named) == 1:      # the one model the file's requests name
        args.served_model_name = next(iter(named))
    args.api_key = None                                     # the requests come from this process
    name, pipe, app = openai_app(args)
    try:
        print(f"  {len(lines)} requests for '{name}'", file=sys.stderr, flush=True)
        with contextlib.ExitStack() as stack:
            out = sys.stdout if args.output == "-" else stack.enter_context(open(args.output, "w", encoding="utf-8"))
            report = asyncio.run(run_batch(app, lines, out, in_flight=args.in_flight or 2 * args.max_num_seqs))
    finally:
        pipe.close()
    print(report.summary(), file=sys.stderr)
    for e in report.errors:
        print(f"  {e}", file=sys.stderr)
    return 0
