"""``shapeplan chat --model DIR``: a terminal chat loop; the KV cache is kept between turns."""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from shapeplan.commands.generate import add_engine_args, add_sampling_args
    p = sub.add_parser("chat", help="chat with a Hugging Face Llama-family checkpoint in the terminal")
    p.add_argument("--model", required=True)
    p.add_argument("--max-new-tokens", type=int, default=256)
    add_sampling_args(p, temperature=0.7, top_p=0.9)
    add_engine_args(p)
    p.set_defaults(func=_chat)


def _chat(args: argparse.Namespace, input_fn=input) -> int:
    from shapeplan.commands.generate import begin_load, load_pipeline, print_metrics, sampling_from
    from shapeplan.errors import InputError
    pipe = load_pipeline(args, begin_load(args.model, args.device))
    sampling = sampling_from(args)
    print("chat: empty line or /exit quits, /reset starts over", file=sys.stderr)
    session = pipe.start_session()
    try:
        while True:
            try:
                line = input_fn("> ")
            except EOFError:
                break
            if line.strip() in ("", "/exit", "/quit"):
                break
            if line.strip() == "/reset":
                session.close()
                session = pipe.start_session()
                continue
            try:
                stream = session.stream(line, max_new_tokens=args.max_new_tokens, sampling=sampling, chat=True)
                for delta in stream:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
            except InputError as e:
                print(f"\n[{e}; starting a new conversation]", file=sys.stderr)
                session.close()
                session = pipe.start_session()
                continue
            sys.stdout.write("\n")
            if args.metrics and stream.result is not None:
                print_metrics(stream.result)
    finally:
        session.close()
    return 0
