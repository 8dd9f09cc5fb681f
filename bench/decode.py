"""LLM decode throughput on the GPU: shapeplan's pipeline per execution mode, optionally beside a
gpt-fast-style PyTorch decoder on the SAME weights (eager, eager + one CUDA graph per step,
torch.compile reduce-overhead), all in one process. Presets have random bf16 weights; greedy decode,
prompt 128, 256 new tokens, KV cache 1,024.

    python3 -m bench.decode                                  # llama-1b and llama-8b, our modes only
    python3 -m bench.decode --presets llama-1b --configs triton --vs-torch-compile --json decode.json
    python3 -m bench.decode --presets llama-1b --configs triton --profile 64   # + where a step's GPU time goes
    python3 -m bench.decode --presets llama-1b --configs triton --paged-forms late,early,strided:16  # kernel A/B

Reported per row: late_steady tok/s (decode steps >= 20), decode tok/s, TTFT, cold start (ours:
pipeline construction + a 32-token warm-up request; torch: warm-up/capture/compile of the step), and
token agreement with our slot_by_slot run (bf16 greedy picks can diverge after near-ties, so agreement
is informative, not a pass/fail). The rows come from ``shapeplan.llm.bench``, the code behind
``shapeplan bench`` (one preset per call); this script runs several presets in one process, prints the
weight-bandwidth floor, and can profile the decode plan (``--profile N``: its segments and a
torch.profiler kernel table over N greedy tokens).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

import torch

from shapeplan.llm.bench import bench_prompt, copy_bandwidth, format_table, run_matrix, torch_baselines
from shapeplan.llm.config import LlamaConfig, preset_config
from shapeplan.llm.weights import random_weights


def profile(cfg: LlamaConfig, weights: dict[str, torch.Tensor], mode: str, *, prompt_len: int,
            max_kv_cache_length: int, tokens: int, rows: int, dtype: torch.dtype | None = None) -> None:
    """The decode plan's segments and a torch.profiler table (CUDA time) over ``tokens`` greedy tokens."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from shapeplan.llm.pipeline import GenerationPipeline
    from shapeplan.llm.sampling import Sampling
    pipe = GenerationPipeline(cfg, weights, None, device="cuda", mode=mode, dtype=dtype or weights[
        "model.embed_tokens.weight"].dtype, max_prefill_length=prompt_len, max_kv_cache_length=max_kv_cache_length,
        sync_every=16, eos_token_ids=[])
    prompt = bench_prompt(cfg.vocab_size, prompt_len)
    pipe.generate(prompt, max_new_tokens=32, sampling=Sampling.greedy())
    print(f"\nprofile ({mode}): plans and segments (index, state, slots, fused steps, reason)")
    for r in pipe.engine.runners():
        segs = [(s.ctx.segment.index, s.state.value, len(s.ctx.slots),
                 getattr(s.handle, "stats", lambda: {})().get("fused_steps"), s.reason[:120]) for s in r.segments]
        print(f"  {r.name} {r.key[1]} {r.phase.value} {segs}")
    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        pipe.generate(prompt, max_new_tokens=tokens, sampling=Sampling.greedy())
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60))
    print(per_step(prof, tokens, rows))
    del pipe


def per_step(prof: Any, tokens: int, rows: int) -> str:
    """The kernels that ran at least once per two decode steps, as µs and launches per step (the
    request's one prefill is spread over the steps: its per-layer kernels show up as ~1/step rows)."""
    found = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if t and e.count >= tokens // 2:
            found.append((t / tokens, e.count / tokens, e.key))
    found.sort(reverse=True)
    lines = [f"\nper decode step ({tokens} tokens; kernels launched >= {tokens // 2} times): "
             f"{sum(f[0] for f in found):.1f} us of device time", f"{'us/step':>9} {'launches':>9}  kernel"]
    lines += [f"{t:9.2f} {c:9.2f}  {k[:100]}" for t, c, k in found[:rows]]
    return "\n".join(lines)


def paged_forms(preset: str, cfg: LlamaConfig, weights: dict[str, torch.Tensor], config: str, args: argparse.Namespace) -> None:
    """late_steady tok/s of ``config`` with each form of the paged decode kernel, interleaved (each row builds
    and captures its own plans, so the form applies to it)."""
    from unittest import mock

    from shapeplan.llm.bench import run_config
    from shapeplan.runtime.backends.triton.kernels import paged as pk
    got: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for form in args.paged_forms.split(","):
            kind, _, splits = form.partition(":")
            if kind not in ("late", "early", "strided"):
                raise SystemExit(f"--paged-forms: expected late, early or strided[:SPLITS], got {form!r}")
            with mock.patch.multiple(pk, EARLY=kind != "late", STRIDED=kind == "strided",
                                     MAX_SPLITS=int(splits or pk.MAX_SPLITS)):
                row = run_config(cfg, weights, config, device="cuda", prompt=bench_prompt(cfg.vocab_size, args.prompt_len),
                                 new_tokens=args.new_tokens, max_kv_cache_length=args.max_kv_cache_length,
                                 max_prefill_length=args.prompt_len)
            got.setdefault(form, []).append(row.late_steady_tok_s if row.ok else float("nan"))
            gc.collect()
            torch.cuda.empty_cache()
    print(f"\n{preset} {config}, late_steady tok/s per round")
    for form, ts in got.items():
        print(f"paged {form:<14}" + "".join(f"{t:>10.1f}" for t in ts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="llama-1b,llama-8b", help="comma-separated presets (random weights)")
    ap.add_argument("--configs", default="slot_by_slot,emulated_replay,cuda_graphs,triton,auto",
                    help="our execution modes to run (unavailable ones are reported as failed rows)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-kv-cache-length", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--vs-torch-compile", action="store_true",
                    help="also run the PyTorch baselines (eager, eager + CUDA graph, torch.compile)")
    ap.add_argument("--no-optimize", action="store_true", help="compile our graph without the optimizer passes")
    ap.add_argument("--decode-attention", default="auto", choices=["auto", "sdpa", "triton"],
                    help="our decode attention: the Triton split-K kernel (auto on CUDA) or SDPA over the cache")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after each preset's rows, profile the last config's decode over N tokens")
    ap.add_argument("--profile-rows", type=int, default=25, help="rows of the profiler's kernel table")
    ap.add_argument("--json", dest="json_path", default=None, help="write the rows as JSON to this file")
    ap.add_argument("--paged-forms", default="", metavar="FORM,..",
                    help="instead of the rows: the first config once per form of the paged decode kernel, interleaved "
                    "(late, early or strided, each optionally :SPLITS, e.g. late,early,strided:16; see "
                    "kernels/paged_jit.py), --rounds times")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of --paged-forms (default 2)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.decode: CUDA is not available, nothing measured (this benchmark needs a GPU; "
              "`shapeplan bench --device cpu` runs the same rows on the CPU)")
        return 0
    from shapeplan.ops.llm import set_decode_attention
    set_decode_attention(args.decode_attention)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "prompt_len": args.prompt_len,
               "new_tokens": args.new_tokens, "max_kv_cache_length": args.max_kv_cache_length,
               "decode_attention": args.decode_attention, "models": {}}
    configs = [c for c in args.configs.split(",") if c]
    bandwidth = copy_bandwidth()                    # timed once (off an H200), before any weights exist
    for preset in [p for p in args.presets.split(",") if p]:
        cfg = preset_config(preset, args.dtype)
        t = time.perf_counter()
        weights = random_weights(cfg, device="cuda", seed=0)
        gb = sum(w.numel() * w.element_size() for w in weights.values()) / 1e9
        print(f"\n{preset}: {gb:.2f} GB of {args.dtype} weights (made in {time.perf_counter() - t:.1f} s)",
              file=sys.stderr)
        if args.paged_forms:
            paged_forms(preset, cfg, weights, configs[0], args)
        else:
            rows_of(preset, cfg, weights, gb, configs, bandwidth, args, results)
        del weights
        gc.collect()
        torch.cuda.empty_cache()
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json_path}", file=sys.stderr)
    return 0


def rows_of(preset: str, cfg: LlamaConfig, weights: dict[str, torch.Tensor], gb: float, configs: list[str],
            bandwidth: float, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """One preset's rows (and, with --profile, its kernel table) into ``results``."""
    rows = run_matrix(cfg, weights, configs, device="cuda", prompt_len=args.prompt_len,
                      new_tokens=args.new_tokens, max_kv_cache_length=args.max_kv_cache_length,
                      optimize=not args.no_optimize, log=lambda s: print(s, file=sys.stderr))
    if args.vs_torch_compile:
        ref = next((r.tokens for r in rows if r.config == "slot_by_slot" and r.ok), None)
        rows += torch_baselines(cfg, weights, bench_prompt(cfg.vocab_size, args.prompt_len), args.new_tokens,
                                args.max_kv_cache_length, ref)
    floor = bandwidth / (gb * 1e9)          # tok/s if every step only streamed the weights
    print(format_table(rows, f"\n{preset} ({gb:.2f} GB, bandwidth floor ~{floor:,.0f} tok/s), "
                             f"prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy, {args.dtype}"))
    results["models"][preset] = {"weights_gb": gb, "rows": [r.to_dict() for r in rows]}
    if args.profile and configs:
        gc.collect()
        profile(cfg, weights, configs[-1], prompt_len=args.prompt_len,
                max_kv_cache_length=args.max_kv_cache_length, tokens=args.profile, rows=args.profile_rows)


if __name__ == "__main__":
    sys.exit(main())
