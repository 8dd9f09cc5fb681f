"""``shapeplan serve``: the servers (docs/serve.md).

    shapeplan serve --model-repository DIR [--port 8000] [--grpc-port 8001]   KServe v2 (HTTP + gRPC)
    shapeplan serve MODEL.onnx|MODEL.pt2 [...]                                 the same, one model
    shapeplan serve --model DIR|FILE.gguf | --preset NAME                      OpenAI-compatible (LLMs)

What is given picks the server: a model repository or an .onnx / .pt2 file selects the KServe tensor
server; ``--model`` / ``--preset`` select the OpenAI-compatible LLM server; both together serve both
protocols on one HTTP port (one app), KServe's gRPC beside it.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    from shapeplan.serve.openai.server import add_llm_arguments
    p = sub.add_parser("serve", help="serve models over HTTP/gRPC: KServe v2 (ONNX, .pt2) or OpenAI-compatible (LLMs)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file", nargs="?", metavar="MODEL.onnx|MODEL.pt2",
                   help="serve this one model over KServe v2 (named after the file)")
    p.add_argument("--model-repository", metavar="DIR",
                   help="serve every .onnx / .pt2 model in DIR over KServe v2 (a model DIR/NAME/ may have a config.json)")
    p.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="none",
                   help="KServe only: 'explicit' lets clients load, reload and unload the repository's models "
                        "while the server runs (Triton's repository API); 'poll' follows the directory: new, "
                        "changed and removed models are loaded, reloaded and unloaded; default none")
    p.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="S",
                   help="with --model-control-mode poll: seconds between scans of the repository (default 15)")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="with --model-control-mode explicit: load this model at start (repeat it; '*': every "
                        "model); without it none is loaded")
    llm = p.add_argument_group("LLM (OpenAI-compatible server)")
    llm.add_argument("--model", metavar="DIR|FILE.gguf", help="a Hugging Face checkpoint directory or a GGUF file")
    llm.add_argument("--preset", metavar="NAME", help="random weights with a public model's shapes (benchmarks)")
    add_llm_arguments(llm)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: any free port)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port, KServe only (default 8001; 0: any free port)")
    p.add_argument("--grpc-procs", type=int, default=0, metavar="N",
                   help="KServe only: serve gRPC in N front-end processes that share the port and hand each "
                        "request to the model process (default 0: in the model process; docs/serve.md)")
    p.add_argument("--device", default="cpu", help="default device of the models (a config.json may override)")
    p.add_argument("--mode", default="auto", help="default execution mode (a config.json may override)")
    p.add_argument("--max-request-bytes", type=int, default=None,
                   help="largest request accepted, HTTP body or gRPC message (default 8 MiB)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    kserve = args.model_repository is not None or args.model_file is not None
    llm = args.model is not None or args.preset is not None
    if llm and not kserve:
        from shapeplan.serve.openai.server import serve_openai
        return serve_openai(args)
    if not kserve:
        print("error: nothing to serve: give --model-repository DIR, a MODEL.onnx / MODEL.pt2 file, or "
              "--model / --preset for an LLM", file=sys.stderr)
        return 2
    if args.model_repository is not None and args.model_file is not None:
        print("error: give --model-repository DIR or one model file, not both", file=sys.stderr)
        return 2
    explicit = args.model_control_mode == "explicit"
    if args.model_control_mode != "none" and args.model_repository is None:
        print(f"error: --model-control-mode {args.model_control_mode} needs --model-repository DIR", file=sys.stderr)
        return 2
    if args.model_control_mode == "poll" and not args.repository_poll_secs > 0:
        print(f"error: --repository-poll-secs must be > 0, got {args.repository_poll_secs}", file=sys.stderr)
        return 2
    if args.load_model and not explicit:
        print("error: --load-model needs --model-control-mode explicit (otherwise every model is loaded)",
              file=sys.stderr)
        return 2
    return _serve_kserve(args, llm)


def _serve_kserve(args: argparse.Namespace, llm: bool) -> int:
    """The KServe server; with ``llm`` (--model / --preset given too) the OpenAI server's routes on the same
    HTTP port (one app; KServe's gRPC on --grpc-port)."""
    if args.grpc_procs < 0:
        print(f"error: --grpc-procs: expected 0 (gRPC in this process) or more front-end processes, got "
              f"{args.grpc_procs}", file=sys.stderr)
        return 2
    try:
        import fastapi, grpc, prometheus_client, uvicorn  # noqa: E401,F401 - the serve extra, checked up front
        from shapeplan.serve.kserve import DEFAULT_MAX_REQUEST_BYTES, KServeServer, ModelRepository, discover, single
    except ImportError as e:
        print(f"error: shapeplan serve needs the serve extra ({e.name} is missing): pip install -e \".[serve]\"",
              file=sys.stderr)
        return 1
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if llm:
        from shapeplan.serve.openai.server import check_llm_args
        problem = check_llm_args(args)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    sources = _sources(args, discover, single)          # a ShapeplanError: main prints it, exit status 1
    repo = ModelRepository(sources, device=args.device, mode=args.mode, root=args.model_repository,
                           control=args.model_control_mode, poll_secs=args.repository_poll_secs)
    pipe = app = None
    if llm:
        from shapeplan.serve.openai.server import openai_app
        llm_name, pipe, app = openai_app(args)
    server = KServeServer(repo, args.host, args.port, args.grpc_port,
                          max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES, log_level="warning",
                          grpc_procs=args.grpc_procs, app=app)

    def start() -> None:
        server.start_listeners()
        loading = ", ".join(s.name for s in sources) or "no model (load them through the repository API)"
        print(f"KServe v2 HTTP on http://{args.host}:{server.http_port}, gRPC on {args.host}:{server.grpc_port}; "
              f"loading {loading}", flush=True)
        if pipe is not None:
            print(f"serving '{llm_name}' (OpenAI API) on http://{args.host}:{server.http_port}/v1", flush=True)
        repo.start()
        print(f"ready: {loading}", flush=True)

    def stop() -> None:
        server.stop()
        if pipe is not None:
            pipe.close()

    from shapeplan.serve.app import serve_until_stopped
    serve_until_stopped(start, stop)
    return 0


def _sources(args: argparse.Namespace, discover: Any, single: Any) -> list:
    """The models to load at start: every one (poll: every one that loads), or (explicit model control) those
    ``--load-model`` names."""
    if args.model_repository is None:
        return single(args.model_file)
    if args.model_control_mode == "poll":           # what loads now; the first scan reports the rest
        from shapeplan.errors import ShapeplanError
        from shapeplan.serve.kserve.repository import find, names
        found = []
        for n in names(args.model_repository, check=True):
            try:
                found.append(find(args.model_repository, n))
            except ShapeplanError as e:
                print(f"warning: {e}", file=sys.stderr)
        return found
    if args.model_control_mode != "explicit":
        return discover(args.model_repository)
    if "*" in args.load_model:
        return discover(args.model_repository, empty_ok=True)
    from shapeplan.serve.kserve.repository import find, names
    names(args.model_repository, check=True)
    return [find(args.model_repository, n) for n in dict.fromkeys(args.load_model)]
