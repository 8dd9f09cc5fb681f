"""``shapeplan generate --model DIR --prompt "..."``: stream a completion to stdout.

The command is one process start, so its own start-up counts (issue 22): it imports what generation
needs and nothing else (tests/llm/test_startup.py checks that no ONNX, transformers, server or jinja2
module is imported), creates the CUDA context on a thread while ``shapeplan.llm`` imports, lets
``from_pretrained`` read the weights straight into device memory while the CUDA warm-up runs, and ends
without the interpreter's teardown (``cli.exit_now``). ``--timings`` prints where the time went.
With ``--keep-alive`` (or ``SHAPEPLAN_KEEP_ALIVE``) the command is a client of a background server that keeps
the model loaded (shapeplan/commands/_keepalive.py): a later run needs no torch, weights or warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with a Hugging Face Llama-family checkpoint")
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    add_sampling_args(p, temperature=0.0, top_p=1.0)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel: N processes, one per device (gloo on CPU, "
                   "NCCL on CUDA); see docs/parallel.md")
    p.add_argument("--timings", action="store_true",
                   help="print the wall-clock breakdown of the command to stderr (a table, then a 'timings {json}' line)")
    p.add_argument("--keep-alive", type=_duration, default=None, metavar="DURATION",
                   help="keep the model loaded in a background server for DURATION after this request (300, 5m, 1h; "
                        "default SHAPEPLAN_KEEP_ALIVE, else 0: off), and stream from it while it runs: the next "
                        "generate of the same model and options starts in a fraction of a second (shapeplan ps, "
                        "shapeplan stop; docs/llm.md)")
    add_engine_args(p)
    p.set_defaults(func=_generate, fast_exit=True)


def add_sampling_args(p: argparse.ArgumentParser, *, temperature: float, top_p: float) -> None:
    """The sampling options of ``generate`` and ``chat`` (their defaults differ: greedy there, sampled here);
    ``sampling_from`` reads them."""
    p.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=top_p)
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens less likely than MIN_P x the likeliest "
                   "(0 = off; llama.cpp's --min-p)")
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's, -2 to 2 (0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's, -2 to 2 (0 = off)")
    p.add_argument("--seed", type=int, default=None)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default="auto", help="execution mode (auto, slot_by_slot, emulated_replay, ...)")
    p.add_argument("--dtype", default=None, help="override the checkpoint dtype (float32, bfloat16, float16)")
    p.add_argument("--max-prefill-length", type=int, default=512)
    p.add_argument("--max-kv-cache-length", type=int, default=2048)
    p.add_argument("--metrics", action="store_true", help="print metrics to stderr when done")
    add_chat_template_arg(p)


def add_chat_template_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a jinja2 chat template (a file, or the template itself) instead of the checkpoint's")


def chat_template_arg(args: argparse.Namespace) -> str | None:
    """``--chat-template``'s text, read and parsed before anything loads (an InputError names the flag)."""
    from shapeplan.llm.tokenizer import read_chat_template
    value = getattr(args, "chat_template", None)
    return read_chat_template(value) if value else None


def use_chat_template(pipe, template: str | None) -> None:
    """Put ``--chat-template``'s text in place of the checkpoint's."""
    if template is None:
        return
    if pipe.tokenizer is None:
        from shapeplan.errors import InputError
        raise InputError("--chat-template: this model has no tokenizer")
    pipe.tokenizer.chat_template = template


def begin_load(model: str, device: str) -> threading.Thread | None:
    """What a command that loads its model (generate, chat, the keep-alive server) starts before the imports the
    load needs: the tokenizer helper (``_tokproc``; usually started already as the package imported) and the
    CUDA context's thread (``start_cuda_init``), which ``load_pipeline`` joins."""
    from shapeplan import _tokproc
    _tokproc.start_for_command(model)
    return start_cuda_init(device)


def load_pipeline(args: argparse.Namespace, cuda_init: threading.Thread | None = None):
    """The command's pipeline, built with Python's cyclic collector held off and what it made frozen after
    (``SHAPEPLAN_GC_PAUSE``, shapeplan/_gc.py: it lives until the command ends); ``cuda_init`` (``begin_load``'s
    thread) is joined once it is built. It runs one request at a time
    (``generate``, ``chat``, the keep-alive server), so its KV pool holds one request of the full
    ``--max-kv-cache-length`` (``max_num_seqs=1``), as llama.cpp's CLI allocates one sequence's context: the
    pipeline's default of 64 requests made llama-1b's command zero and hold a 4 GiB pool, llama-8b's 16 GiB."""
    from shapeplan import _gc
    from shapeplan.llm import GenerationPipeline
    template = chat_template_arg(args)
    with _gc.startup():
        pipe = GenerationPipeline.from_pretrained(args.model, device=args.device, mode=args.mode, dtype=args.dtype,
                                                  max_prefill_length=args.max_prefill_length,
                                                  max_kv_cache_length=args.max_kv_cache_length, max_num_seqs=1)
    if cuda_init is not None:
        cuda_init.join()
    use_chat_template(pipe, template)
    return pipe


def sampling_from(args: argparse.Namespace):
    from shapeplan.llm import Sampling
    return Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty, seed=args.seed,
                    presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, min_p=args.min_p)


#: the request metrics ``--metrics`` prints (a keep-alive server sends these)
METRICS = ("ttft_s", "total_s", "decode_tok_s", "late_steady_tok_s", "effective_tok_s")


def metric_values(res) -> dict:
    """``res``'s METRICS by name (what ``--metrics`` prints; a keep-alive server sends them)."""
    return {k: getattr(res.metrics, k) for k in METRICS}


def print_metrics(res, file=None) -> None:
    print_metric_values(len(res.token_ids), res.finish_reason, metric_values(res), file)


def print_metric_values(tokens: int, finish: str | None, m: dict, file=None) -> None:
    file = file if file is not None else sys.stderr  # resolved per call (stderr may be swapped)
    print(f"[{tokens} tokens, finish={finish}, TTFT {m['ttft_s'] * 1e3:.1f} ms, "
          f"decode {m['decode_tok_s']:.1f} tok/s, late_steady {m['late_steady_tok_s']:.1f} tok/s, "
          f"effective {m['effective_tok_s']:.1f} tok/s]", file=file)


def _duration(text: str) -> float:
    from shapeplan.env import duration
    try:
        return duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {e}") from None


def _generate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    before = since_process_start()
    from shapeplan import env
    keep_alive = args.keep_alive if args.keep_alive is not None else env.get("SHAPEPLAN_KEEP_ALIVE")
    if keep_alive > 0:
        if args.tp > 1:
            from shapeplan.errors import InputError
            raise InputError(f"--keep-alive {keep_alive:g}: a kept-alive server runs on one device; "
                             f"not with --tp {args.tp} (use --keep-alive 0)")
        from shapeplan.commands._keepalive import run_client
        return run_client(args, keep_alive, t0, before)
    if args.tp > 1:
        from shapeplan.parallel.cli import generate
        return generate(args, chat_template_arg(args))
    cuda_init = begin_load(args.model, args.device)
    from shapeplan.llm import GenerationPipeline  # noqa: F401 - timed apart from the pipeline's start
    t_imports = time.perf_counter()
    _parts.append(("import shapeplan.llm", t0, t_imports))      # after the interpreter and torch (--timings)
    pipe = load_pipeline(args, cuda_init)
    t_loaded = time.perf_counter()
    stream = pipe.stream(args.prompt, max_new_tokens=args.max_new_tokens, sampling=sampling_from(args),
                         chat=args.chat)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    pipe.close()
    if args.metrics and stream.result is not None:
        print_metrics(stream.result)
    if args.timings:
        t_end = time.perf_counter()
        # the interpreter, `import shapeplan` (torch), the parser (which imports shapeplan.llm), the rest
        phases = {"interpreter + imports": (before or 0.0) + t_imports - t0}
        phases.update({k: v for k, v in pipe.timings.items() if k != "warm-up wait"})
        phases["pipeline (other)"] = t_loaded - t_imports - sum(v for k, v in pipe.timings.items()
                                                                  if k != "warm-up wait")
        m = stream.result.metrics if stream.result is not None else None
        wait = pipe.timings.get("warm-up wait", 0.0)
        if m is not None:
            phases["warm-up wait"] = wait
            phases["prefill"] = max(0.0, m.ttft_s - wait)
            phases["decode"] = m.total_s - m.ttft_s
        phases["output + close"] = t_end - t_loaded - (m.total_s if m is not None else 0.0)
        phases["in process"] = (before or 0.0) + t_end - t0
        print_timings(phases)
        print_warmup_parts(t0 - (before or 0.0))
    return 0


def since_process_start() -> float | None:
    """Seconds since this process started (Linux ``/proc``, 10 ms resolution; None elsewhere)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])        # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


#: (name, start, end) of the CUDA context's thread and the shapeplan.llm import, perf_counter clock (``--timings``)
_parts: list[tuple[str, float, float]] = []


def start_cuda_init(device: str) -> threading.Thread | None:
    """On CUDA, create the device's context on a thread now: it then overlaps the rest of the command's
    imports and the config and tokenizer reads instead of starting the weights load. Best effort: a
    failure here is the load's to report."""
    if not device.startswith("cuda"):
        return None

    def init() -> None:
        t = time.perf_counter()
        import torch
        try:
            dev = torch.device(device)
            if dev.index is not None:
                torch.cuda.set_device(dev.index)
            torch.empty(1, device=dev)
        except Exception:  # noqa: BLE001, S110 - the weights load raises the real error
            pass
        finally:
            _parts.append(("context", t, time.perf_counter()))
    t = threading.Thread(target=init, name="shapeplan-cuda-init", daemon=True)
    t.start()
    return t


def print_warmup_parts(origin: float, file=None) -> None:
    """The CUDA warm-up's parts (``llm/warmup.py``: each loads the libraries and kernel modules of some of
    the model's ops), with the CUDA context's thread, the shapeplan.llm import and the tokenizer helper's
    parse (start to parsed), as start-end seconds since ``origin`` (the process start, ``time.perf_counter``
    clock), then one ``warm-up parts {json}`` line; nothing when no warm-up ran."""
    from shapeplan import _tokproc
    from shapeplan.llm import warmup
    if not warmup.timings:
        return
    file = file if file is not None else sys.stderr
    parts = {name: (round(a - origin, 4), round(b - origin, 4))
             for name, a, b in [*_parts, *_tokproc.timeline, *warmup.timings]}
    print("warm-up parts (s since the process started): "
          + ", ".join(f"{n} {a:.3f}-{b:.3f}" for n, (a, b) in parts.items()), file=file)
    print("warm-up parts " + json.dumps(parts), file=file)


def print_timings(phases: dict[str, float], file=None) -> None:
    """The breakdown as a table, then one ``timings {json}`` line (bench/startup.py reads it)."""
    file = file if file is not None else sys.stderr
    width = max(len(k) for k in phases)
    print("timings (s):", file=file)
    for k, v in phases.items():
        print(f"  {k:<{width}} {v:8.3f}", file=file)
    print("timings " + json.dumps({k: round(v, 4) for k, v in phases.items()}), file=file)
