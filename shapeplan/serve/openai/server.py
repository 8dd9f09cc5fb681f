"""The OpenAI-compatible server: ``build_openai_app`` (the routes on the one serving app,
``shapeplan.serve.app.build_app``, with ``/metrics`` and errors in OpenAI's shape) and ``serve_openai``
(what ``shapeplan serve --model/--preset`` runs: load, capture every bucket, listen, print the URL).

Nothing here imports FastAPI at module level: the CLI registers its arguments without the extra."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from shapeplan.serve.openai import DEFAULT_MAX_REQUEST_BYTES


#: --reasoning-parser's names: one parser (reasoning.py) under vLLM's names too
REASONING_PARSERS = ("think", "deepseek_r1", "qwen3")


def build_openai_app(pipe: Any, *, model_name: str, api_key: str | None = None, checkpoint: str | None = None,
                     max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, reasoning_parser: str | None = None) -> Any:
    """One FastAPI app serving ``pipe`` as ``model_name``; ``checkpoint``: the directory whose
    generation_config.json supplies sampling defaults; ``reasoning_parser``: ``think`` (reasoning.py) or None."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException

    from shapeplan.errors import ShapeplanError
    from shapeplan.serve.app import build_app
    from shapeplan.serve.openai.errors import BadRequest, MethodNotAllowed, NotFound
    from shapeplan.serve.openai.generation import GenerationDefaults, OpenAIModel
    from shapeplan.serve.openai.metrics import registry_for
    from shapeplan.serve.openai.routes import bearer, error_response, openai_router

    registry, latency = registry_for(pipe, model_name)
    model = OpenAIModel(pipe, model_name, latency, GenerationDefaults.from_checkpoint(checkpoint))
    model.reasoning = reasoning_parser is not None
    app = build_app([openai_router(model, api_key=api_key, max_request_bytes=max_request_bytes)])
    app.state.model, app.state.registry = model, registry

    @app.get("/metrics", dependencies=bearer(api_key))      # the app's own /metrics, behind the API key
    def metrics() -> Any:                       # a thread of the pool: the scrape never holds up the loop
        from fastapi.responses import Response
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(ShapeplanError)
    async def ours(request: Request, e: ShapeplanError) -> Any:       # e.g. a refused API key
        return error_response(e)

    @app.exception_handler(HTTPException)
    async def http(request: Request, e: HTTPException) -> Any:        # unknown path, wrong method
        from fastapi.responses import JSONResponse
        if request.url.path.startswith("/v2"):     # a KServe path (both servers on one app): its error shape
            return JSONResponse({"error": f"{request.method} {request.url.path}: {e.detail}"}, e.status_code)
        cls = {404: NotFound, 405: MethodNotAllowed}.get(e.status_code)
        if cls is None:
            return JSONResponse({"error": {"message": str(e.detail), "type": "invalid_request_error", "param": None,
                                           "code": None}}, e.status_code)
        return error_response(cls(f"{request.method} {request.url.path}: {e.detail}"))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> Any:
        return error_response(BadRequest(f"invalid request: {e.errors()[0].get('msg', e)}"))

    return app


# ---------------------------------------------------------------------------- the command
def add_llm_arguments(p: argparse.ArgumentParser | Any) -> None:
    """The OpenAI server's own options of ``shapeplan serve`` (besides --model/--preset, --host,
    --port, --device, --mode, --max-request-bytes, --log-level)."""
    p.add_argument("--dtype", default=None, help="override the checkpoint dtype (float32, bfloat16, float16); "
                   "presets default to bfloat16")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded at once (default 64)")
    p.add_argument("--kv-cache-bytes", type=int, default=None,
                   help="bytes of the paged KV pool (default: room for max-num-seqs full-length requests, at most "
                        "90%% of free device memory)")
    p.add_argument("--max-kv-cache-length", type=int, default=4096, help="the context: prompt + generated tokens")
    p.add_argument("--max-prefill-length", type=int, default=None,
                   help="the largest prefill chunk (default 2048, at most half the context)")
    p.add_argument("--max-waiting", type=int, default=4096,
                   help="requests that may wait for a slot; beyond it the server answers 503 (default 4096)")
    p.add_argument("--no-prefix-cache", action="store_true", help="turn the block prefix cache off")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: the "
                   "checkpoint directory's name, or the preset's)")
    p.add_argument("--api-key", default=None,
                   help="require Authorization: Bearer KEY on every endpoint but /health")
    from shapeplan.commands.generate import add_chat_template_arg
    add_chat_template_arg(p)
    p.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="return a thinking model's <think> ... </think> as reasoning_content beside the answer "
                        "(think; vLLM's names deepseek_r1 and qwen3 are the same parser)")


def load_pipeline(args: argparse.Namespace) -> Any:
    from shapeplan.commands.generate import chat_template_arg, use_chat_template
    from shapeplan.llm import GenerationPipeline
    template = chat_template_arg(args)
    kw = dict(device=args.device, mode=args.mode, max_num_seqs=args.max_num_seqs, kv_cache_bytes=args.kv_cache_bytes,
              max_kv_cache_length=args.max_kv_cache_length,
              max_prefill_length=args.max_prefill_length or min(2048, args.max_kv_cache_length // 2),
              max_waiting=args.max_waiting, prefix_cache=not args.no_prefix_cache)
    if args.preset:
        pipe = GenerationPipeline.from_preset(args.preset, dtype=args.dtype or "bfloat16", **kw)
    else:
        pipe = GenerationPipeline.from_pretrained(args.model, dtype=args.dtype, **kw)
    use_chat_template(pipe, template)
    return pipe


def check_llm_args(args: argparse.Namespace) -> str | None:
    """What is wrong with --model / --preset (None: nothing)."""
    from shapeplan.llm.config import PRESETS
    if args.model and args.preset:
        return "give --model or --preset, not both"
    if args.model and not os.path.exists(args.model):
        return f"--model {args.model}: no such checkpoint directory or GGUF file"
    if args.preset and args.preset not in PRESETS:
        return f"--preset {args.preset}: no such preset (there are {', '.join(sorted(PRESETS))})"
    return None


def openai_app(args: argparse.Namespace) -> tuple[str, Any, Any]:
    """(served name, pipeline, app) for --model / --preset: load, capture every bucket, build the app."""
    name = args.served_model_name or (args.preset or os.path.basename(os.path.normpath(args.model)))
    t0 = time.perf_counter()
    print(f"loading {args.preset or args.model} on {args.device} ...", file=sys.stderr, flush=True)
    pipe = load_pipeline(args)
    try:
        pipe.warmup()
        print(f"  loaded and captured {len(pipe.decode_buckets)} decode and {len(pipe.buckets)} prefill buckets in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        app = build_openai_app(pipe, model_name=name, api_key=args.api_key,
                               checkpoint=args.model if args.model and os.path.isdir(args.model) else None,
                               max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
                               reasoning_parser=args.reasoning_parser)
    except BaseException:
        pipe.close()
        raise
    return name, pipe, app


def serve_openai(args: argparse.Namespace) -> int:
    """``shapeplan serve --model DIR|FILE.gguf | --preset NAME``: load, capture every batch bucket,
    listen, print the URL, serve until SIGINT / SIGTERM."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(f"error: shapeplan serve needs the serve extra ({e.name} is missing): pip install -e \".[serve]\"",
              file=sys.stderr)
        return 1
    problem = check_llm_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    name, pipe, app = openai_app(args)
    from shapeplan.serve.app import HttpServer, serve_until_stopped
    server = HttpServer(app, args.host, args.port, log_level=args.log_level)

    def start() -> None:
        server.start()
        host = f"[{server.host}]" if ":" in server.host else server.host
        print(f"serving '{name}' (OpenAI API) on http://{host}:{server.port}/v1", flush=True)

    def stop() -> None:
        server.stop()
        pipe.close()

    serve_until_stopped(start, stop)
    return 0
