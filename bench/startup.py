"""Start-up time and memory of the LLM pipeline on the GPU, weights excluded: cold (empty plan and
Triton caches) and warm (the disk cache an earlier process left: frozen-plan records, compiled
kernels, check verdicts). With ``--generate-cmd``: the whole ``shapeplan generate`` command instead.

    python3 -m bench.startup                          # llama-1b triton: 1 cold + 3 warm starts, a table
    python3 -m bench.startup --warm 6 --json s.json
    SHAPEPLAN_CACHE_DIR=/tmp/c python3 -m bench.startup --once --timeline    # one start in this process
    python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda   # the command, twice
    python3 -m bench.startup --generate-cmd --preset llama-tiny --dtype float32 --device cpu
    python3 -m bench.startup --generate-cmd --preset llama-1b --device cuda --runs 3 --keep-alive 300

``--generate-cmd`` writes a random checkpoint of the preset to a temporary directory (safetensors as
save_pretrained writes them, config.json, a synthetic byte-level BPE tokenizer of the preset's vocabulary;
nothing downloads; the file is then in the page cache), byte-compiles shapeplan (as an install would),
then runs ``python3 -m shapeplan generate --model DIR --prompt ... --max-new-tokens N --device D
--timings`` ``--runs`` times (default 2), each a fresh process in one new empty ``SHAPEPLAN_CACHE_DIR``
(so the first run is cold, the second warm), and prints the wall time of each run (measured outside)
with the breakdown the command reports (``--timings``); "exit + unaccounted" is the wall time minus
the command's own total (the interpreter's exit, the process start before ``/proc`` counts it). With
``--keep-alive D`` each run is ``generate --keep-alive D``: the first starts the background server that keeps
the model loaded (shapeplan/commands/_keepalive.py), the later runs stream from it; it is stopped after.

Each start is a fresh process (``--once``): random weights are made on the GPU first (not timed), then
the clock runs over pipeline construction and a 32-token first request (so the prefill and decode
plans are built and captured), what ``shapeplan bench`` calls "cold s". Memory beyond weights =
torch.cuda.memory_allocated() after that request minus before construction (the KV cache is part of
it). The cold start gets a new empty cache directory and the warm starts reuse it. ``--once`` prints
one JSON line last; ``--timeline`` and ``--cprofile N`` print where the time went (diagnostics events
with their times and the warm-up's parts; the N most expensive functions).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # the child runs `-m bench.startup` here


def once(a: argparse.Namespace) -> None:
    """One start in this process; prints its JSON line last."""
    from shapeplan.llm.bench import bench_prompt
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.pipeline import GenerationPipeline
    from shapeplan.llm.sampling import Sampling
    from shapeplan.llm.weights import random_weights
    if a.switch_interval:
        os.environ["SHAPEPLAN_STARTUP_SWITCH_INTERVAL"] = repr(a.switch_interval)
    cfg = preset_config(a.preset, "bfloat16")
    w = random_weights(cfg, device="cuda", seed=0)
    wbytes = sum(t.numel() * t.element_size() for t in w.values())
    prompt = bench_prompt(cfg.vocab_size, 128)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    prof = cProfile.Profile() if a.cprofile else None
    if a.timeline:
        from shapeplan import diagnostics
        diagnostics.enable(categories=["LIFECYCLE", "SEGMENT", "GRAPH_REPLAY", "COMPILE", "CACHE", "FALLBACK",
                                       "VERIFY", "FUSION"], level="detailed")
        diagnostics.record("LIFECYCLE", "t0")
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    pipe = GenerationPipeline(cfg, w, None, device="cuda", mode=a.mode, dtype=torch.bfloat16,
                              max_prefill_length=a.max_prefill_length, max_kv_cache_length=a.max_kv_cache_length,
                              sync_every=16, eos_token_ids=[])
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    pipe.generate(prompt, max_new_tokens=32, sampling=Sampling.greedy())
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    if prof:
        prof.disable()
    extra = torch.cuda.memory_allocated() - base
    if a.timeline:
        from shapeplan import diagnostics
        from shapeplan.llm import warmup
        evs = diagnostics.events()
        base_t = next(e.t for e in evs if e.message == "t0")
        keep = ("plan", "segment", "kernels", "reason", "state", "kernel", "seconds", "workers", "site", "nodes",
                "outputs", "tokens", "key")
        for e in evs:
            f = {k: v for k, v in e.fields.items() if k in keep}
            print(f"  {1000 * (e.t - base_t):8.1f} ms  {e.category:<12} {e.message}  {f}")
        for name, a0, a1 in warmup.timings:
            print(f"  warm-up part {name:<12} {1000 * (a0 - t0):8.1f} -> {1000 * (a1 - t0):8.1f} ms")
        print(f"  {1000 * (t1 - t0):8.1f} ms  (constructed)   {1000 * (t2 - t0):8.1f} ms  (first request done)")
    res = pipe.generate(prompt, max_new_tokens=64, sampling=Sampling.greedy())
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(a.cprofile)
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.cprofile // 2)
        # who compiles Python source at start-up (ast.parse, exec of generated code, namedtuple, ...)
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_callers(r"builtins\.(compile|exec)|ast\.py.*\(parse\)")
        print(s.getvalue())
    print(json.dumps({"label": a.label, "preset": a.preset, "mode": a.mode, "construct_s": round(t1 - t0, 3),
                      "first_request_s": round(t2 - t1, 3), "start_s": round(t2 - t0, 3),
                      "extra_mb": round(extra / 1e6, 1), "weights_mb": round(wbytes / 1e6, 1),
                      "extra_pct_of_weights": round(100 * extra / wbytes, 2),
                      "reserved_mb": round(torch.cuda.memory_reserved() / 1e6, 1),
                      "late_steady_64": round(res.metrics.late_steady_tok_s, 1)}))


def series(a: argparse.Namespace) -> list[dict]:
    """One cold start in a new cache directory, then ``a.warm`` warm starts on it, each a fresh process."""
    cache = a.cache_dir or tempfile.mkdtemp(prefix="sp_startup_")
    passed = ["--preset", a.preset, "--mode", a.mode, "--max-prefill-length", str(a.max_prefill_length),
              "--max-kv-cache-length", str(a.max_kv_cache_length)]
    passed += ["--timeline"] if a.timeline else []
    passed += ["--cprofile", str(a.cprofile)] if a.cprofile else []
    passed += ["--switch-interval", repr(a.switch_interval)] if a.switch_interval else []
    rows = []
    for label in ["cold"] + [f"warm{i}" for i in range(1, a.warm + 1)]:
        cmd = [sys.executable, "-m", "bench.startup", "--once", "--label", label] + passed
        env = dict(os.environ, SHAPEPLAN_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=a.timeout)
            out, err = p.stdout, f"exit status {p.returncode}: {(p.stderr.strip() or p.stdout.strip())[-600:]}"
        except subprocess.TimeoutExpired:
            out, err = "", f"timed out after {a.timeout} s"
        lines = out.strip().splitlines()
        if a.timeline or a.cprofile:
            print(f"== {label}\n" + "\n".join(lines[:-1]))
        try:
            rows.append(json.loads(lines[-1]))
        except (IndexError, ValueError):
            rows.append({"label": label, "error": err})
    return rows


def write_checkpoint(preset: str, dtype: str, path: str) -> int:
    """A random checkpoint of ``preset`` in ``path`` (config.json, model.safetensors, tokenizer); returns
    its weight bytes. Weights are made on the GPU when there is one (fast), written from the CPU."""
    from safetensors.torch import save_file

    from bench.structured import synthetic_tokenizer
    from shapeplan.llm.config import PRESETS, preset_config
    from shapeplan.llm.weights import random_weights
    cfg = preset_config(preset, dtype)
    v = cfg.vocab_size                     # the synthetic tokenizer's last two tokens: <s>, </s>
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
              "max_position_embeddings": 131072, "bos_token_id": v - 2, "eos_token_id": v - 1,
              "torch_dtype": dtype, **PRESETS[preset]}
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = random_weights(cfg, device=dev, dtype=getattr(torch, dtype), seed=0)
    w = {k: t.detach().to("cpu").contiguous() for k, t in w.items()}
    if dev == "cuda":
        torch.cuda.empty_cache()           # the runs' processes get the whole device
    save_file(w, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    synthetic_tokenizer(v, path)
    return sum(t.numel() * t.element_size() for t in w.values())


def torch_bytecode_note() -> str:
    """'' when torch's modules have bytecode, else a line saying that every process compiles torch from
    source here (the lent H200 machines ship torch without .pyc and set PYTHONDONTWRITEBYTECODE=1: ~4 s
    of each `import torch`; `pip install` leaves the bytecode on a user's machine)."""
    import importlib.util
    if os.path.exists(importlib.util.cache_from_source(torch.__file__)):
        return ""
    site = os.path.dirname(os.path.dirname(torch.__file__))
    from shapeplan import env
    pyc = env.get("SHAPEPLAN_PYCACHE")
    return (f"note: torch has no bytecode here (dont_write_bytecode={int(sys.flags.dont_write_bytecode)}): a process "
            f"compiles it from source, seconds of each import; SHAPEPLAN_PYCACHE={pyc} (auto/on: the command's first "
            f"run writes it under the cache root, later runs read it); `python3 -m compileall -q -j 0 {site}` makes "
            f"it what `pip install` leaves")


def generate_cmd(a: argparse.Namespace) -> int:
    """Time the real ``shapeplan generate`` command (see the module docstring)."""
    import compileall
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench.startup --generate-cmd: CUDA is not available, nothing measured (--device cpu runs on the CPU)")
        return 0
    work = tempfile.mkdtemp(prefix="sp_startup_gen_")
    ckpt = os.path.join(work, "ckpt")
    t0 = time.perf_counter()
    nbytes = write_checkpoint(a.preset, a.dtype, ckpt)
    print(f"checkpoint: {a.preset} {a.dtype}, {nbytes / 1e9:.2f} GB in {ckpt} "
          f"(written in {time.perf_counter() - t0:.1f} s, not timed)", flush=True)
    compileall.compile_dir(os.path.join(ROOT, "shapeplan"), quiet=2)
    note = torch_bytecode_note()
    if note:
        print(note, flush=True)
    cache = a.cache_dir or os.path.join(work, "cache")
    cmd = [sys.executable, "-m", "shapeplan", "generate", "--model", ckpt, "--prompt", a.prompt,
           "--max-new-tokens", str(a.new_tokens), "--device", a.device, "--timings"]
    cmd += ["--mode", a.mode] if a.mode else []
    cmd += ["--keep-alive", a.keep_alive] if a.keep_alive else []
    env = dict(os.environ, SHAPEPLAN_CACHE_DIR=cache)
    env.pop("SHAPEPLAN_KEEP_ALIVE", None)
    rows: list[dict] = []
    for i in range(a.runs):
        label = ["first", "second"][i] if i < 2 else f"run{i + 1}"
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=a.timeout)
            wall, rc, err = time.perf_counter() - t, p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            wall, rc, err = time.perf_counter() - t, -1, f"timed out after {a.timeout} s"
        line = next((ln for ln in reversed(err.splitlines()) if ln.startswith("timings {")), None)
        if rc != 0 or line is None:
            rows.append({"run": label, "error": f"exit status {rc}: {err.strip()[-600:]}"})
            continue
        phases = json.loads(line[len("timings "):])
        parts = next((json.loads(ln[len("warm-up parts "):]) for ln in err.splitlines()
                      if ln.startswith("warm-up parts {")), {})
        rows.append({"run": label, "wall": round(wall, 4), **phases,
                     "exit + unaccounted": round(wall - phases["in process"], 4), "warm-up parts": parts})
    if a.keep_alive:                  # the server the first run started (its key holds this run's cache dir)
        subprocess.run([sys.executable, "-m", "shapeplan", "stop", "--model", ckpt], cwd=ROOT, env=env,
                       capture_output=True, timeout=120)
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") and torch.cuda.is_available() else a.device
    print(f"\n`shapeplan generate` on {dev}: {a.preset} {a.dtype} random checkpoint, {a.new_tokens} new tokens, "
          f"each run a fresh process (one new SHAPEPLAN_CACHE_DIR: first cold, then warm)"
          + (f"; --keep-alive {a.keep_alive}: the first run starts the server, the later ones are its clients"
             if a.keep_alive else ""))
    ok = [r for r in rows if "error" not in r]
    names = ["wall"] + [k for k in (ok[0] if ok else {}) if k not in ("run", "wall", "warm-up parts")]
    print(f"{'phase (s)':<24}" + "".join(f"{r['run']:>10}" for r in rows))
    for n in names:
        print(f"{n:<24}" + "".join(f"{r.get(n, float('nan')):>10.3f}" if "error" not in r else f"{'FAILED':>10}"
                                   for r in rows))
    for r in rows:
        if "error" in r:
            print(f"{r['run']}: {r['error']}")
        elif r["warm-up parts"]:            # each part of the CUDA warm-up, start-end since the process started
            print(f"{r['run']} warm-up parts (s): "
                  + ", ".join(f"{n} {s:.2f}-{e:.2f}" for n, (s, e) in r["warm-up parts"].items()))
    if a.json_path:
        with open(a.json_path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    if not a.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return 1 if len(ok) < len(rows) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.startup", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--mode", default=None, help="execution mode (default: triton; the command's own, auto, "
                    "with --generate-cmd)")
    ap.add_argument("--max-prefill-length", type=int, default=128)
    ap.add_argument("--max-kv-cache-length", type=int, default=1024)
    ap.add_argument("--warm", type=int, default=3, help="warm starts after the cold one (default 3)")
    ap.add_argument("--cache-dir", default="", help="cache directory of the series (default: a new empty one)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per start (default 120)")
    ap.add_argument("--once", action="store_true",
                    help="one start in this process (cold or warm as SHAPEPLAN_CACHE_DIR holds); JSON line last")
    ap.add_argument("--label", default="", help="label of the --once JSON line")
    ap.add_argument("--timeline", action="store_true",
                    help="print the lifecycle/compile/capture events of the timed region with their times")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="print the N most expensive functions (cumulative) of the timed region")
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="set SHAPEPLAN_STARTUP_SWITCH_INTERVAL (0: the default)")
    ap.add_argument("--json", dest="json_path", default=None, help="write the series' rows as JSON to this file")
    g = ap.add_argument_group("--generate-cmd: the whole `shapeplan generate` command")
    g.add_argument("--generate-cmd", action="store_true",
                   help="time `python3 -m shapeplan generate` on a random checkpoint of --preset (CPU or GPU)")
    g.add_argument("--device", default="cuda", help="the command's --device (default cuda)")
    g.add_argument("--dtype", default="bfloat16", help="the checkpoint's dtype (default bfloat16)")
    g.add_argument("--new-tokens", type=int, default=256, help="the command's --max-new-tokens (default 256)")
    g.add_argument("--prompt", default="Explain KV caching in two sentences.")
    g.add_argument("--runs", type=int, default=2, help="runs of the command (default 2: first, second)")
    g.add_argument("--keep", action="store_true", help="keep the temporary checkpoint and cache directory")
    g.add_argument("--keep-alive", default="", metavar="DURATION",
                   help="run the command with --keep-alive DURATION (the first run starts a server that keeps the "
                        "model loaded, the next are its clients); the server is stopped after the runs")
    a = ap.parse_args(argv)
    if a.generate_cmd:
        return generate_cmd(a)
    a.mode = a.mode or "triton"
    if not torch.cuda.is_available():
        print("bench.startup: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return 0
    if a.once:
        once(a)
        return 0
    rows = series(a)
    print(f"\n{a.preset} {a.mode} start-up on {torch.cuda.get_device_name()}, weights excluded "
          f"(construction + a 32-token first request), each start a fresh process")
    print(f"{'start':<8} {'construct s':>11} {'1st request s':>13} {'start s':>8} {'beyond weights MB':>17} "
          f"{'% of weights':>12} {'late_steady_64':>14}")
    for r in rows:
        if "error" in r:
            print(f"{r['label']:<8} FAILED {r['error']}")
            continue
        print(f"{r['label']:<8} {r['construct_s']:>11.3f} {r['first_request_s']:>13.3f} {r['start_s']:>8.3f} "
              f"{r['extra_mb']:>17.1f} {r['extra_pct_of_weights']:>12.2f} {r['late_steady_64']:>14.1f}")
    if a.json_path:
        with open(a.json_path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
