"""``shapeplan generate --model DIR --prompt "..."``: stream a completion to stdout."""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with a Hugging Face Llama-family checkpoint")
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel: N processes, one per device (gloo on CPU, "
                   "NCCL on CUDA); see docs/parallel.md")
    add_engine_args(p)
    p.set_defaults(func=_generate)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default="auto", help="execution mode (auto, slot_by_slot, emulated_replay, ...)")
    p.add_argument("--dtype", default=None, help="override the checkpoint dtype (float32, bfloat16, float16)")
    p.add_argument("--max-prefill-length", type=int, default=512)
    p.add_argument("--max-kv-cache-length", type=int, default=2048)
    p.add_argument("--metrics", action="store_true", help="print metrics to stderr when done")


def load_pipeline(args: argparse.Namespace):
    from shapeplan.llm import GenerationPipeline
    return GenerationPipeline.from_pretrained(args.model, device=args.device, mode=args.mode, dtype=args.dtype,
                                              max_prefill_length=args.max_prefill_length,
                                              max_kv_cache_length=args.max_kv_cache_length)


def sampling_from(args: argparse.Namespace):
    from shapeplan.llm import Sampling
    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty, seed=args.seed)


def print_metrics(res, file=None) -> None:
    file = file if file is not None else sys.stderr  # resolved per call (stderr may be swapped)
    m = res.metrics
    print(f"[{len(res.token_ids)} tokens, finish={res.finish_reason}, TTFT {m.ttft_s * 1e3:.1f} ms, "
          f"decode {m.decode_tok_s:.1f} tok/s, late_steady {m.late_steady_tok_s:.1f} tok/s, "
          f"effective {m.effective_tok_s:.1f} tok/s]", file=file)


def _generate(args: argparse.Namespace) -> int:
    if args.tp > 1:
        from shapeplan.parallel.cli import generate
        return generate(args)
    pipe = load_pipeline(args)
    stream = pipe.stream(args.prompt, max_new_tokens=args.max_new_tokens, sampling=sampling_from(args),
                         chat=args.chat)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.metrics and stream.result is not None:
        print_metrics(stream.result)
    return 0
