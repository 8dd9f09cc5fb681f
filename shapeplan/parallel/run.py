"""Tensor-parallel workers: what each rank runs for ``generate --tp``, ``bench --tp`` and the tests.

Every rank builds the same pipeline over its shard and runs the same steps (same prompt ids, same
sampling, same host-sync points: the picked tokens are identical on every rank, so EOS and stop
strings end every rank's loop at the same step). Rank 0 owns the prompt: it tokenizes and broadcasts
the ids, and it is the only one that prints or returns results.
"""
from __future__ import annotations

import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from shapeplan.parallel.tensor import TensorParallel


def tp_pipeline(path: str, rank: int, world_size: int, device: str, **kw: Any):
    """A GenerationPipeline over rank ``rank``'s shard of the checkpoint at ``path``."""
    from shapeplan.llm import GenerationPipeline
    kw.setdefault("progress", False)
    return GenerationPipeline.from_pretrained(path, device=device, tp=TensorParallel(rank, world_size), **kw)


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def generate_worker(rank: int, world_size: int, device: str, path: str, prompt: str, opts: dict[str, Any],
                    pipe_kw: dict[str, Any]) -> dict[str, Any] | None:
    """``shapeplan generate --tp N``: rank 0 tokenizes, streams the text to stdout and returns the result."""
    from shapeplan.llm import Sampling
    pipe = tp_pipeline(path, rank, world_size, device, **pipe_kw)
    if rank == 0 and opts.get("chat_template"):
        pipe.tokenizer.chat_template = opts["chat_template"]           # (--chat-template: checked by the command)
    ids = _broadcast(pipe.encode(prompt, chat=opts.get("chat", False)) if rank == 0 else None)
    sampling = Sampling(**opts.get("sampling", {}))
    n = int(opts.get("max_new_tokens", 128))
    if rank != 0:
        pipe.generate(ids, max_new_tokens=n, sampling=sampling)
        return None
    stream = pipe.stream(ids, max_new_tokens=n, sampling=sampling)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    res = stream.result
    m = res.metrics
    return {"token_ids": res.token_ids, "text": res.text, "finish_reason": res.finish_reason,
            "ttft_s": m.ttft_s, "decode_tok_s": m.decode_tok_s, "late_steady_tok_s": m.late_steady_tok_s,
            "effective_tok_s": m.effective_tok_s}


def tokens_worker(rank: int, world_size: int, device: str, cases: list[dict[str, Any]]) -> list[list[int]] | None:
    """Greedy token ids for each case ``{path, ids, max_new_tokens, mode, ...pipeline kwargs}`` (tests)."""
    from shapeplan.llm import Sampling
    out = []
    for case in cases:
        case = dict(case)
        path, ids, n = case.pop("path"), case.pop("ids"), case.pop("max_new_tokens")
        pipe = tp_pipeline(path, rank, world_size, device, **case)
        out.append(pipe.generate(ids, max_new_tokens=n, sampling=Sampling.greedy()).token_ids)
    return out if rank == 0 else None


def bench_worker(rank: int, world_size: int, device: str, source: dict[str, Any], configs: list[str],
                 opts: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``shapeplan bench --tp N``: per config, a warm-up then a timed greedy request (same prompt and
    columns as ``shapeplan bench``); rank 0 returns the rows."""
    from shapeplan.llm.bench import BenchRow, bench_prompt, load_model
    from shapeplan.llm.pipeline import GenerationPipeline
    from shapeplan.llm.sampling import Sampling
    # made (or loaded) on this rank's device: a preset's random weights are the same on every rank (same
    # seed, same kind of device); 8b made on the CPU took over a minute per rank
    cfg, weights = load_model(source.get("preset"), source.get("model"), device, source.get("dtype"))
    prompt = bench_prompt(cfg.vocab_size, opts["prompt_len"])
    rows = []
    for c in configs:
        row = BenchRow(f"{c} tp={world_size}")
        try:
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            pipe = GenerationPipeline(cfg, weights, None, device=device, mode=c,
                                      dtype=weights["model.embed_tokens.weight"].dtype,
                                      max_prefill_length=max(opts["prompt_len"], 16),
                                      max_kv_cache_length=opts["max_kv_cache_length"], sync_every=16,
                                      eos_token_ids=[], optimize=opts.get("optimize", True),
                                      tp=TensorParallel(rank, world_size))
            pipe.generate(prompt, max_new_tokens=min(opts["new_tokens"], 32), sampling=Sampling.greedy())
            _sync(device)
            row.cold_start_s = time.perf_counter() - t0
            dist.barrier()
            res = pipe.generate(prompt, max_new_tokens=opts["new_tokens"], sampling=Sampling.greedy())
            row.take_metrics(res.metrics)
            row.tokens = res.token_ids
            del pipe
        except Exception:
            # said at once, with the rank, then raised: a failure of this rank alone (its device, its
            # shard) would otherwise leave the other ranks waiting in their next collective for good
            print(f"[rank {rank}] bench config {c} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            raise
        rows.append(row)
    return [{**r.to_dict(), "tokens": r.tokens} for r in rows] if rank == 0 else None


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
