"""``shapeplan serve``: the OpenAI-compatible LLM server (docs/serve.md).

    shapeplan serve --model DIR|FILE.gguf | --preset NAME [--device cuda] [--port 8000] [--api-key KEY]
"""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from shapeplan.serve.openai.server import add_llm_arguments
    p = sub.add_parser("serve", help="serve an LLM over an OpenAI-compatible HTTP API",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    llm = p.add_argument_group("LLM (OpenAI-compatible server)")
    llm.add_argument("--model", metavar="DIR|FILE.gguf", help="a Hugging Face checkpoint directory or a GGUF file")
    llm.add_argument("--preset", metavar="NAME", help="random weights with a public model's shapes (benchmarks)")
    add_llm_arguments(llm)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: any free port)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default="auto", help="execution mode (auto, slot_by_slot, emulated_replay, cuda_graphs, triton)")
    p.add_argument("--max-request-bytes", type=int, default=None, help="largest request body accepted (default 8 MiB)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.model is None and args.preset is None:
        print("error: nothing to serve: give --model DIR|FILE.gguf or --preset NAME", file=sys.stderr)
        return 2
    from shapeplan.serve.openai.server import serve_openai
    return serve_openai(args)
