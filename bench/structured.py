"""Structured output throughput: unconstrained vs JSON-schema-constrained decoding, single stream and N
concurrent requests, with the host's per-token mask time and what overlapping it with the device hides.

    python3 -m bench.structured --preset llama-1b --device cuda                   # the issue 20 targets
    python3 -m bench.structured --preset llama-tiny --vocab 128256 --device cpu   # host costs on a CPU

Every request: a 32-token prompt, ``--new-tokens`` tokens (EOS ignored; a constrained request still
ends where its grammar ends), greedy unless ``--temperature``. A constrained batch runs the forward
plan and the masked sampler plan per step (shapeplan/llm/batch/constrained.py); "overlap off" makes
the host fill the masks before queuing the forward instead of while it runs. Columns: output tok/s
(all requests' tokens over the wall time, prefill included), the share of the unconstrained rate,
tokens per request, host mask time per constrained token (matcher accept + mask fill + forced-run
checks), host wait per step (time the host idled for the device), and the share of tokens that were
forced runs taken without decoding. Presets have no tokenizer: a synthetic byte-level BPE vocabulary of
the model's size is built (no training, ~1 s; ``--tokenizer DIR`` takes a real ``tokenizer.json``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import torch

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "year": {"type": "integer"},
    "rating": {"enum": ["G", "PG", "PG-13", "R"]},
    "cast": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24}, "role": {"type": "string", "maxLength": 24},
        "lead": {"type": "boolean"}}, "required": ["name", "role", "lead"]}}},
    "required": ["title", "year", "rating", "cast"]}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE spells every byte with one of these)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def synthetic_tokenizer(vocab_size: int, path: str) -> str:
    """A byte-level BPE tokenizer of exactly ``vocab_size`` tokens written to ``path``: the 256 byte
    tokens, then words (made-up syllable words, with and without a leading space, capitalized, numbers,
    JSON punctuation runs) entered with every prefix, as trained vocabularies grow; ``</s>`` is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    rng = random.Random(0)
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []
    want = vocab_size - 2
    syl = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiouy"] + list("aeiou") + ["th", "ch", "sh", "ng", "er"]
    punct = ['{"', '":', '": "', '", "', '"}', '},', '}]', '[{', ', ', '":[', '":{', '\n', '  ', '    ', '()', '=>']

    def add(text: str) -> None:
        word = "".join(table[b] for b in text.encode())
        for k in range(2, len(word) + 1):
            if len(vocab) >= want:
                return
            if word[:k] not in vocab:
                merges.append((word[:k - 1], word[k - 1]))
                vocab[word[:k]] = len(vocab)

    for p in punct:
        add(p)
    for n in range(1000):
        add(str(n))
        add(" " + str(n))
    while len(vocab) < want:
        w = "".join(rng.choice(syl) for _ in range(rng.randint(1, 4)))
        add(rng.choice(["", " ", " ", " "]) + (w.capitalize() if rng.random() < 0.2 else w))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>"}, f)
    return path


def host_only(tokenizer: Any, vocab: int, eos: int, constraint: Any, counts: list[int], steps: int) -> list[dict]:
    """The host's share of a constrained decode step without a model: N matchers in lockstep, each step
    accepting one token per row (drawn at random from the row's mask, not timed) and filling the next
    masks (xgrammar fill, UTF-8 guard, forced-run rule: timed), as ``Structured.decode`` does while the
    device runs the forward. This is the work the overlap must hide behind the forward on the GPU."""
    import numpy as np

    from shapeplan.llm.grammar import grammars_for
    g = grammars_for(tokenizer, vocab, (eos,))
    rows = []
    for n in counts:
        best = None
        for _ in range(3):                      # the same tokens each time; the least timed is kept
            r = _host_steps(g, constraint, n, vocab, eos, steps, np.random.default_rng(n))
            best = r if best is None or r["host_us_per_step"] < best["host_us_per_step"] else best
        rows.append(best)
    return rows


def _host_steps(g: Any, constraint: Any, n: int, vocab: int, eos: int, steps: int, rng: Any) -> dict[str, Any]:
    import numpy as np

    from shapeplan.llm.grammar import fill_rows
    states = [g.start(constraint) for _ in range(n)]
    mask = torch.empty(n, -(-vocab // 32), dtype=torch.int32)
    timed, done = 0.0, 0
    for _ in range(steps):
        t0 = time.perf_counter()
        fill_rows([(i, st) for i, st in enumerate(states) if st.end < 0], mask)
        timed += time.perf_counter() - t0
        picks = []
        for i, st in enumerate(states):
            bits = np.unpackbits(mask[i].numpy().view(np.uint8), bitorder="little")[:vocab]
            allowed = np.flatnonzero(bits)
            allowed = allowed[allowed != eos] if len(allowed) > 1 else allowed
            picks.append(int(rng.choice(allowed)))
        t0 = time.perf_counter()
        for st, t in zip(states, picks):
            if st.end < 0:
                st.accept(t)
        timed += time.perf_counter() - t0
        done += sum(st.end < 0 for st in states)
    return {"n": n, "host_us_per_step": timed / steps * 1e6, "host_us_per_row_step": timed / max(1, done) * 1e6}


def run(pipe: Any, n: int, constraint: Any, args: argparse.Namespace) -> dict[str, Any]:
    from shapeplan.llm import Sampling
    st = pipe.structured.stats
    before = st.as_dict()
    rng = random.Random(n)
    prompts = [[rng.randrange(3, pipe.cfg.vocab_size - 2) for _ in range(32)] for _ in range(n)]
    sampling = [Sampling(temperature=args.temperature, seed=i, constraint=constraint) for i in range(n)]
    t0 = time.perf_counter()
    handles = [pipe.submit(p, args.new_tokens, s, ignore_eos=True) for p, s in zip(prompts, sampling)]
    for h in handles:
        h.wait()
        h.raise_for_error()
    wall = time.perf_counter() - t0
    tokens = sum(len(h.token_ids) for h in handles)
    d = {k: v - before[k] for k, v in st.as_dict().items()}
    return {"n": n, "tok_s": tokens / wall, "tokens_per_request": tokens / n, "wall_s": wall,
            "mask_us_per_token": d["host_s"] / max(1, d["row_steps"] + d["first_tokens"]) * 1e6,
            "wait_us_per_step": d["wait_s"] / max(1, d["steps"]) * 1e6,
            "forced_share": d["jump_tokens"] / max(1, tokens), "steps": d["steps"], "early_ends": d["early_ends"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.structured", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-1b", help="random-weight model shapes (shapeplan.llm.PRESETS)")
    ap.add_argument("--model", help="a Hugging Face checkpoint directory instead of a preset (its tokenizer is used)")
    ap.add_argument("--tokenizer", help="a directory with tokenizer.json for a preset (default: synthetic)")
    ap.add_argument("--vocab", type=int, help="override the preset's vocabulary size (CPU host-cost runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--concurrency", default="1,32", help="comma-separated request counts")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--schema", help="a JSON Schema file (default: a movie record with an open cast list)")
    ap.add_argument("--no-overlap-runs", action="store_true", help="skip the overlap-off rows")
    ap.add_argument("--host-only", action="store_true",
                    help="no model: time the host's per-step work (accept + mask fill) for N matchers in lockstep")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available() and not args.host_only:
        print("bench.structured: no CUDA device here; nothing measured (use --device cpu for host costs)")
        return 0
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        print("bench.structured: xgrammar is not installed (pip install 'shapeplan[structured]'); nothing measured")
        return 0
    from shapeplan.llm import Constraint, GenerationPipeline, Tokenizer
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.weights import random_weights

    counts = [int(x) for x in args.concurrency.split(",")]
    if args.host_only:
        vocab = args.vocab or preset_config(args.preset, args.dtype).vocab_size
        tdir = args.model or args.tokenizer or synthetic_tokenizer(vocab, tempfile.mkdtemp(prefix="sp-bench-tok-"))
        tok = Tokenizer(tdir)
        schema = json.load(open(args.schema, encoding="utf-8")) if args.schema else SCHEMA
        rows = host_only(tok, max(vocab, tok.vocab_size), tok.eos_token_id, Constraint.json_schema(schema), counts,
                         args.new_tokens)
        print(f"# host only: vocabulary {max(vocab, tok.vocab_size)}, {args.new_tokens} steps, {os.cpu_count()} cores")
        print("| N | host µs per step | host µs per row-step |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['n']} | {r['host_us_per_step']:.0f} | {r['host_us_per_row_step']:.0f} |")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"host_only": rows}, f, indent=1)
        return 0
    kw = dict(device=args.device, mode=args.mode, max_prefill_length=64, max_kv_cache_length=64 + args.new_tokens + 64,
              max_num_seqs=max(counts), sync_every=8)
    t0 = time.perf_counter()
    if args.model:
        pipe = GenerationPipeline.from_pretrained(args.model, dtype=args.dtype, **kw)
        source = args.model
    else:
        cfg = preset_config(args.preset, args.dtype)
        if args.vocab:
            cfg = dataclasses.replace(cfg, vocab_size=args.vocab)
        tdir = args.tokenizer or synthetic_tokenizer(cfg.vocab_size, tempfile.mkdtemp(prefix="sp-bench-tok-"))
        tok = Tokenizer(tdir)
        pipe = GenerationPipeline(cfg, random_weights(cfg, device=args.device), tok,
                                  eos_token_ids=[tok.eos_token_id], **kw)
        source = f"{args.preset}{f' vocab {args.vocab}' if args.vocab else ''} ({'tokenizer ' + args.tokenizer if args.tokenizer else 'synthetic tokenizer'})"
    schema = json.load(open(args.schema, encoding="utf-8")) if args.schema else SCHEMA
    c = Constraint.json_schema(schema)
    pipe.warmup(structured=True)
    for con in (None, c):                                     # grammar compile, first calls of every path
        run(pipe, 1, con, argparse.Namespace(**{**vars(args), "new_tokens": 16}))
    print(f"# {source}, {args.device} {args.dtype} mode={args.mode}, {args.new_tokens} new tokens, "
          f"temperature {args.temperature}; set-up {time.perf_counter() - t0:.1f} s")
    rows: list[dict[str, Any]] = []
    for n in counts:
        base = run(pipe, n, None, args)
        rows.append({"run": "unconstrained", "overlap": "-", **base})
        for overlap in ((True,) if args.no_overlap_runs else (True, False)):
            pipe.structured.overlap = overlap
            r = run(pipe, n, c, args)
            rows.append({"run": "json_schema", "overlap": "on" if overlap else "off", **r,
                         "vs_unconstrained": r["tok_s"] / base["tok_s"]})
        pipe.structured.overlap = True
    print("| run | N | overlap | tok/s | vs unconstrained | tokens/request | host mask µs/token | host wait µs/step | forced share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        vs = f"{r['vs_unconstrained']:.0%}" if "vs_unconstrained" in r else "-"
        cons = r["run"] != "unconstrained"
        print(f"| {r['run']} | {r['n']} | {r['overlap']} | {r['tok_s']:,.0f} | {vs} | {r['tokens_per_request']:.0f} | "
              f"{r['mask_us_per_token']:.0f} | {r['wait_us_per_step']:.0f} | "
              f"{r['forced_share']:.0%} |" if cons else
              f"| {r['run']} | {r['n']} | - | {r['tok_s']:,.0f} | - | {r['tokens_per_request']:.0f} | - | - | - |")
    for n in counts:
        on = next((r for r in rows if r["n"] == n and r["overlap"] == "on"), None)
        off = next((r for r in rows if r["n"] == n and r["overlap"] == "off"), None)
        if on and off:
            hidden = (off["wall_s"] - on["wall_s"]) / on["tokens_per_request"] * 1e3
            print(f"N={n}: overlap hides {hidden:.3f} ms per token of each request "
                  f"({off['tok_s']:,.0f} -> {on['tok_s']:,.0f} tok/s)")
    if not args.device.startswith("cuda"):
        print("(on the CPU every call is synchronous: the overlap has nothing to hide, and the masked sampler's "
              "[N, V] copies and mask cost CPU time that a GPU spends in microseconds; read the host columns)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"source": source, "device": args.device, "rows": rows}, f, indent=1)
    pipe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
