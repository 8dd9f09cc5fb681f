"""Every ``SHAPEPLAN_*`` environment switch: one typed table, read through ``get``.

    from shapeplan import env
    env.get("SHAPEPLAN_CACHE_DIR")          # -> str | None
    env.get("SHAPEPLAN_TRITON_WORKERS")     # -> int | None (unset: the caller's default)

A row is ``Switch(name, type, default, meaning)``. ``get`` reads the variable now (a test may set it
between calls), parses it by its type, and returns the default when it is unset or empty; a value its
type does not allow raises ``SwitchError`` naming the variable, the value and what is expected. Nothing
on the replay hot path calls ``get``: such switches are read once, at import or when an engine, a plan
or a captured segment is built, and kept.

Types: ``bool`` (1/0, true/false, on/off, yes/no), ``int``, ``float``, ``str``, ``path``, ``names`` (a
comma-separated list, returned as a tuple), ``a|b|c`` (one of these words; ``auto|on|off`` also
takes a boolean's spellings for on / off), and the decode-attention
choice ``auto|sdpa|triton[:split,warps,dot]`` (returned as ``(mode, (split, warps, dot) | None)``).

The README's table of switches is generated from this one (``shapeplan env --markdown``;
tests/test_env.py checks that they agree); ``shapeplan env`` lists them with the values set now.
This module imports the standard library and ``shapeplan.errors`` only (no torch).
"""
from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from shapeplan.errors import SwitchError


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    type: str
    default: Any
    meaning: str


DECODE_ATTENTION_TYPE = "auto|sdpa|triton[:split,warps,dot]"

SWITCHES: tuple[Switch, ...] = (
    # ---- diagnostics
    Switch("SHAPEPLAN_DIAGNOSTICS", "names", (),
           "record engine decisions of these categories (COMPILE, EXECUTE, SEGMENT, FUSION, GRAPH_REPLAY, "
           "FALLBACK, CACHE, ...; ALL: every one; 0/off/none: none)"),
    Switch("SHAPEPLAN_DIAGNOSTICS_LEVEL", "summary|detailed|full", "summary", "how much each recorded event holds"),
    Switch("SHAPEPLAN_DIAGNOSTICS_FILE", "path", None,
           "write the JSON diagnostics report there at exit (every category unless SHAPEPLAN_DIAGNOSTICS names some)"),
    # ---- optimizer
    Switch("SHAPEPLAN_OPTIMIZER", "bool", True, "run the optimizer's passes (0: the graph as imported)"),
    Switch("SHAPEPLAN_OPTIMIZER_SKIP", "names", (), "optimizer passes to skip, by name (docs/optimizer.md)"),
    Switch("SHAPEPLAN_OPTIMIZER_LOG", "bool", False, "log each rewrite the optimizer applies"),
    Switch("SHAPEPLAN_OPTIMIZER_FAST_MATH", "bool", False,
           "allow algebraic identities that are not exact in floating point"),
    Switch("SHAPEPLAN_VERIFY", "bool", False, "check the IR after every optimizer pass"),
    # ---- caches
    Switch("SHAPEPLAN_CACHE_DIR", "path", None,
           "root of every on-disk cache: plans in <dir>/plans, Triton's kernels, sources and verdicts beside "
           "them (default: ~/.cache/shapeplan)"),
    Switch("SHAPEPLAN_CACHE_OVERRIDE_DIR", "path", None, "a read-only plan cache directory, looked up first"),
    Switch("SHAPEPLAN_CACHE_FORCE_RECOMPILE", "bool", False, "ignore cached plans and write fresh ones"),
    Switch("SHAPEPLAN_DISK_CACHE", "bool", None,
           "the disk plan cache on or off (default: on for model files, off for in-memory graphs)"),
    Switch("SHAPEPLAN_FROZEN_RECORDS", "bool", None,
           "frozen-plan records: a plan's recorded layouts kept on disk so a warm start captures on its first "
           "call (default: on for CUDA engines, off on the CPU; docs/runtime.md)"),
    # ---- GPU: numerics and capture
    Switch("SHAPEPLAN_DETERMINISTIC", "bool", False,
           "bit-comparable GPU runs (TF32 off, deterministic algorithms, a fixed cuBLAS workspace)"),
    Switch("SHAPEPLAN_TF32", "bool", False, "allow TF32 in matmuls and convolutions (ignored when deterministic)"),
    Switch("SHAPEPLAN_CAPTURE_FIRST", "bool", True,
           "capture a segment before its first eager run when every Triton step's check verdict is on disk "
           "(0: always run it eagerly first; docs/runtime.md)"),
    Switch("SHAPEPLAN_WEIGHT_GUARD", "full|sampled", "full",
           "check every constant on every call, or a rotating chunk per replay"),
    Switch("SHAPEPLAN_FAULT", "names", (),
           "fault injection at these steps (staging, allocation, capture, capture_oom): the engine must raise a "
           "clear error and recover; read once at import (tests: runtime.faults.inject)"),
    # ---- Triton
    Switch("SHAPEPLAN_TRITON_VERIFY", "bool", False,
           "check fused kernels against slot_by_slot at every capture (also on random inputs) and every replay; "
           "read when a segment is captured"),
    Switch("SHAPEPLAN_TRITON_WARM", "bool", True,
           "compile Triton kernels ahead of capture on a thread pool, and prepare Triton when an engine is created"),
    Switch("SHAPEPLAN_TRITON_WORKERS", "int", None,
           "processes that compile new Triton kernels side by side (default min(8, CPUs - 1); 0: compile in-process)"),
    Switch("SHAPEPLAN_TRITON_WORKER_NICE", "int", 10,
           "priority offset of those processes (below this process, which still compiles the plan while they "
           "start; 0: the same)"),
    Switch("SHAPEPLAN_TRITON_CTYPES", "bool", True,
           "load and launch our kernels through the CUDA driver API (0: Triton's own C helper and per-signature "
           "launchers; docs/gpu.md)"),
    Switch("SHAPEPLAN_TRITON_LAZY_GLUON", "bool", True,
           "import Triton's Gluon (triton.experimental.gluon) at its first use, not at Triton's first launch "
           "(0: at the first launch, as Triton does: ~0.1-0.2 s of a warm start; triton/lazy_gluon.py)"),
    Switch("SHAPEPLAN_TRITON_JIT_KEYS", "bool", False,
           "remember Triton's cache key and source lines of each of shapeplan's kernels between processes (stamp "
           "of the sources and Triton, globals' values checked), instead of parsing each kernel's source at its "
           "first launch and tokenizing it at import (triton/jit_keys.py; off until timed on a GPU)"),
    Switch("SHAPEPLAN_TRITON_PRELOAD", "bool", False,
           "record the Triton kernels a pipeline's start-up used; the next start loads them on the warm-up "
           "threads and captures plans without fused steps before any eager run (triton/preload.py; off until "
           "timed on a GPU)"),
    Switch("SHAPEPLAN_TRITON_STAMP_KEY", "bool", True,
           "key Triton's kernel cache by the installation stamp in every lookup (0: Triton's own key, a hash "
           "of its library: 0.5-1.4 s per process where a lookup bypasses the compile manifest)"),
    Switch("SHAPEPLAN_TRITON_EARLY_IMPORT", "bool", True,
           "import Triton (unpatched) with shapeplan.llm, where torch is a CUDA build (0: the first triton-mode "
           "engine imports it)"),
    # ---- LLM pipeline
    Switch("SHAPEPLAN_LLM_DECODE_ATTENTION", DECODE_ATTENTION_TYPE, ("auto", None),
           "decode-step attention: the Triton split-K kernel on CUDA, SDPA elsewhere (auto) / always SDPA / the "
           "Triton kernel wherever it runs; ':split,warps,dot' tunes that kernel (bench/gpu_decode_attention.py)"),
    Switch("SHAPEPLAN_LLM_PREFILL_ATTENTION", "auto|efficient|sdpa", "auto",
           "prefill attention on CUDA: the memory-efficient kernel for small score matrices, SDPA's choice (cuDNN "
           "on Hopper) above / always the first / always SDPA's choice"),
    Switch("SHAPEPLAN_LLM_FUSED_GEMV", "bool", True,
           "decode steps of at most 8 rows on CUDA run each norm + projection (+ SiLU gate or residual add) as one "
           "Triton GEMV (0: the unfused kernels; shapeplan/ops/fused_linear.py)"),
    Switch("SHAPEPLAN_LLM_GEMV_PDL", "bool", True,
           "launch the fused decode GEMVs with programmatic dependent launch (Hopper+): each loads its first weight "
           "tile while the kernel before it ends (H200: llama-1b 1,008 -> 1,075 tok/s; 0: plain launches)"),
    Switch("SHAPEPLAN_LLM_GEMV_PREFETCH", "bool", True,
           "with PDL, the decode GEMV of the attention's output projection asks L2 for its whole weight while the "
           "attention runs (kernels/gemv_jit.py PF, qgemv.py L2PF). H100, thirty-ninth session: llama-8b 181.1-181.5 "
           "against 179.0-181.0 tok/s off, llama-8b Q8_0 279.6 / 281.9 against 278.7 / 277.0, llama-1b unchanged "
           "(0: off)"),
    Switch("SHAPEPLAN_PAGED_EARLY", "bool", True,
           "the paged decode attention's EARLY form: its block-table entries read before the kernel before it ends, "
           "q, this step's k / v and the first key tile asked for together after (the new token patched in from "
           "registers), each next tile prefetched (kernels/paged_jit.py). End to end against the form without it "
           "(thirty-sixth session): llama-8b 233.9 / 235.2 vs 232.4 / 233.0 tok/s (H200), 180.2 vs 179.4 (H100, "
           "median of 4); 64 requests of llama-1b 20,258 / 20,875 vs 20,064 / 19,845 tok/s (H100); 0: the form "
           "without it"),
    Switch("SHAPEPLAN_QUANT_GEMV_PDL", "auto|on|off", "auto",
           "launch the one-row quantized GEMVs (kernels/qgemv.py) with programmatic dependent launch (Hopper+); "
           "auto: on for matrices of 4,096 or more outputs and inputs (llama-8b's, H100: 8b Q8_0 263 -> 277 tok/s), "
           "off for smaller ones (H200: llama-1b Q4_K_M 1,200 tok/s off, 1,123 on)"),
    Switch("SHAPEPLAN_QUANT_INT8_X", "bool", True,
           "the one-row quantized GEMVs may read x as int8 codes per block of 32 (one dp4a per weight word, "
           "x quantized by a kernel before; kernels/qgemv.py XQ = 2 and 3) where qgemv.TUNE chose it: ~1 % output "
           "error against dequantize-then-matmul, as llama.cpp's q8_1 path (0: x stays in the activation dtype)"),
    Switch("SHAPEPLAN_QUANT_REPACK", "bool", True,
           "GGUF loads onto a GPU store each Q4_K / Q6_K / Q8_0 matrix as Q4_K_R / Q6_K_R / Q8_0_R (each row's "
           "code bytes, then its header bytes: every block's codes aligned; shapeplan/quant/formats.py), made on "
           "the device at load (H200: llama-8b Q8_0 286 -> 320 tok/s, 1b Q8_0 1,036 -> 1,106, 8b Q4_K_M 365 -> "
           "371, 1b Q4_K_M tied; 0: the file's layouts)"),
    Switch("SHAPEPLAN_QUANT_ATTN_X", "auto|on|off", "auto",
           "a paged decode step's attention kernel also writes the o projection's x as int8 codes, so no x quantizer "
           "launches before o (auto: on CUDA where o's one-row tile reads int8 x, qgemv.TUNE's XQ 2 / 3: llama-8b's "
           "quantized types; on: wherever o is a one-row type, tests; shapeplan/llm/model.py attention_x_codes; H100: 8b "
           "Q4_K_M +0.5-1.5 %, Q8_0 within the noise)"),
    Switch("SHAPEPLAN_QUANT_CPU", "auto|packed|unpack", "auto",
           "a CPU LLM pipeline keeps quantized weights packed and dequantizes each matrix per call (packed: the "
           "memory of the file), or dequantizes them once when it is built, into the activation dtype (unpack: "
           "the memory of the float model; llama-125m Q4_K_M bf16 2.5-3.2 -> 17-23 tok/s on the 2-CPU dev box); "
           "auto: unpack when the float weights take at most a quarter of the machine's memory"),
    Switch("SHAPEPLAN_QUANT_MMQ_MAX_ROWS", "int", None,
           "a decode step's 5 (Q8_0_R: 3) to this many rows of a Q4_K_R / Q6_K_R / Q8_0_R matrix whose one-row "
           "kernel reads x as int8 codes run the integer tensor-core GEMM of kernels/mmq.py (int8 tl.dot; rows agree "
           "with single-stream decode to float rounding; default: mmq.MMQ's max_m, 16, where it measured fastest; "
           "0 = never: then batched decode of up to 8 rows is bit for bit single-stream decode)"),
    Switch("SHAPEPLAN_QUANT_ONE_ROW", "bool", True,
           "one row of a Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / IQ4_NL / IQ4_XS weight runs the one-row kernel of "
           "kernels/qgemv.py (0: the generic quantized GEMV of kernels/gguf.py, and the fused quantized ops' unfused "
           "path)"),
    Switch("SHAPEPLAN_LAUNCH_AHEAD", "auto|on|off", "auto",
           "the serving core launches a decode round before it reads the previous one back, so the GPU does not "
           "wait for the host between rounds (llm/batch/engine.py); auto: every round on a GPU, none on the CPU (H100: "
           "a lone stream, llama-1b 971 -> 998 tok/s, llama-1b Q4_K_M 1,212 -> 1,265, llama-125m 3,777 -> 4,177; "
           "llama-1b, 64 requests at once 21,770 -> 22,819 output tok/s; the OpenAI server, 64 streaming clients "
           "16,678-17,178 -> 19,124-19,715); on: every round, the CPU too; off: never"),
    Switch("SHAPEPLAN_DECODE_IN_PLACE", "bool", True,
           "a decode round's steps write each step's next token and position straight into the decode plan's input "
           "buffers (engine.input_buffers, run(copy=False)): a step copies 3 small tensors on the device, not 8 "
           "(llm/batch/runner.py; H100: llama-125m 4,200 / 3,835 -> 4,431 / 4,361 tok/s, llama-1b +0.8 %; 0: every step's "
           "inputs copied in and its outputs copied out)"),
    Switch("SHAPEPLAN_CUDA_WARM", "bool", True,
           "the LLM pipeline's CUDA warm-up (loads cuBLAS, attention, index, cache-write and elementwise kernels "
           "while the graph is built)"),
    Switch("SHAPEPLAN_CUDA_WARM_THREADS", "int", 4,
           "1: the CUDA warm-up's parts one after another (any other value: each on its own thread)"),
    Switch("SHAPEPLAN_STARTUP_SWITCH_INTERVAL", "float", 0.0002,
           "GIL switch interval in seconds while a CUDA LLM pipeline starts (0: Python's 5 ms; docs/gpu.md)"),
    Switch("SHAPEPLAN_WEIGHTS_STREAM", "bool", True,
           "CUDA checkpoint loads read the safetensors files into pinned buffers on several threads and copy "
           "them straight to the device (0: copy each tensor from the memory map; shapeplan/llm/stream_load.py)"),
    Switch("SHAPEPLAN_LOAD_THREADS", "int", None, "threads that read checkpoint files (default min(4, CPUs))"),
    Switch("SHAPEPLAN_GC_PAUSE", "bool", True,
           "a `shapeplan` command's process holds Python's cyclic garbage collector off while shapeplan imports and "
           "while generate / chat build their pipeline, then freezes the objects made (gc.freeze; shapeplan/_gc.py: "
           "no full collection walks them); a program importing shapeplan keeps its collector as it was (0: off)"),
    Switch("SHAPEPLAN_PYCACHE", "auto|on|off", "auto",
           "a `shapeplan` command keeps Python's bytecode in <cache root>/pycache (sys.pycache_prefix) and may write "
           "it there even under PYTHONDONTWRITEBYTECODE, so torch is compiled from source once, not in every command; "
           "auto: only where the installed torch ships no bytecode (shapeplan/_bytecode.py); a library import and "
           "a prefix the user set are left alone"),
    Switch("SHAPEPLAN_KEEP_ALIVE", "duration", 0.0,
           "`shapeplan generate`'s --keep-alive when the flag is not given: keep the model loaded in a background "
           "server that long after each request and stream the next generate of the same model and options from it "
           "(300, 5m, 1h; 0: off, the model lives and ends with the command; shapeplan/commands/_keepalive.py)"),
    Switch("SHAPEPLAN_FAST_EXIT", "bool", True,
           "`shapeplan generate` ends with os._exit after the atexit handlers (0: the interpreter's full teardown)"),
    Switch("SHAPEPLAN_TOKENIZER_PROCESS", "auto|on|off", "auto",
           "`shapeplan generate` / `chat` parse the checkpoint's tokenizer.json in a helper process started as the "
           "command's `import shapeplan` begins, beside torch's import and the weights load, and encode / decode "
           "through it (the parse holds the GIL, so no thread can hide it; shapeplan/_tokproc.py); auto: where this "
           "process may use 2 or more CPUs (with one, the parse would only take the command's own time)"),
    Switch("SHAPEPLAN_TOKENIZER_THREAD", "auto|on|off", "auto",
           "from_pretrained parses tokenizer.json on a thread while the weights load and the graph is built, and "
           "waits for it before returning (on; auto is off on every device: tokenizers holds the GIL while it "
           "parses, so the Python work beside it waits: H200 and CPU measured no gain)"),
    Switch("SHAPEPLAN_WARM_DURING_LOAD", "bool", True,
           "a CUDA from_pretrained starts the CUDA warm-up before the weights load, so the two overlap (0: the "
           "warm-up starts with the pipeline's construction, after the load)"),
    # ---- tensor / pipeline parallel
    Switch("SHAPEPLAN_HANG_DUMP_S", "float", 0.0,
           "tensor-parallel workers print every thread's Python stack to stderr after N s and every N s after "
           "(where a stuck rank waits; 0: off)"),
    Switch("SHAPEPLAN_DIST_DESTROY_S", "float", 30.0,
           "how long leave_group() (and the --tp workers) wait for the process group's destroy before giving up "
           "with a message"),
)

BY_NAME: dict[str, Switch] = {s.name: s for s in SWITCHES}

#: names that switches had before; setting one warns and names the switch that replaced it
RENAMED: dict[str, str] = {
    "SHAPEPLAN_DECODE_ATTN": "SHAPEPLAN_LLM_DECODE_ATTENTION=MODE:split,warps,dot",
}

_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def _bool(v: str) -> bool:
    low = v.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("a boolean: 1/0, true/false, on/off or yes/no")


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise ValueError("a whole number") from None


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        raise ValueError("a number") from None


def duration(v: str) -> float:
    """Seconds of ``v``: a number of seconds, or one with a unit ``s``, ``m`` or ``h`` (``300``, ``5m``, ``1.5h``);
    0 is off. ``ValueError`` says what was expected."""
    t = str(v).strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:]) if t else None
    try:
        value = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        raise ValueError("seconds, or a number with s, m or h (e.g. 300, 5m, 1h; 0 = off)") from None
    if not 0 <= value < float("inf"):
        raise ValueError("seconds, or a number with s, m or h (e.g. 300, 5m, 1h; 0 = off), not negative")
    return value


def _names(v: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in v.split(",") if s.strip())


def _decode_attention(v: str) -> tuple[str, tuple[int, int, bool] | None]:
    mode, _, tuning = v.partition(":")
    mode = _choice("auto|sdpa|triton", mode.strip())
    if not tuning:
        return mode, None
    parts = [s.strip() for s in tuning.split(",")]
    try:
        split, warps, dot = parts
        return mode, (int(split), int(warps), dot.lower() in ("1", "true", "dot"))
    except ValueError:
        raise ValueError("auto, sdpa or triton, optionally followed by ':split,warps,dot' (e.g. triton:16,2,0)") \
            from None


def _auto_on_off(v: str) -> str:
    """``auto``, ``on`` or ``off``; a boolean's other spellings (1/0, true/false, yes/no) mean on / off."""
    if v.lower() == "auto":
        return "auto"
    try:
        return "on" if _bool(v) else "off"
    except ValueError:
        raise ValueError("auto, on or off (or 1/0, true/false, yes/no)") from None


def _choice(kind: str, v: str) -> str:
    options = kind.split("|")
    if v.lower() not in options:
        raise ValueError("one of " + ", ".join(options))
    return v.lower()


_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": _bool, "int": _int, "float": _float, "str": str, "path": str, "names": _names, "duration": duration,
    DECODE_ATTENTION_TYPE: _decode_attention, "auto|on|off": _auto_on_off,
}


def parse(switch: Switch, raw: str) -> Any:
    """``raw`` (a non-empty value of ``switch``'s variable) as its type; ``SwitchError`` when it is not one."""
    parser = _PARSERS.get(switch.type)
    try:
        if parser is None:
            return _choice(switch.type, raw)
        return parser(raw)
    except ValueError as e:
        raise SwitchError(f"{switch.name}={raw!r}: expected {e} ({switch.meaning})") from None


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the switch ``name`` from the environment (or ``environ``), parsed by its type; its
    default when the variable is unset or empty (whitespace around a value is ignored)."""
    switch = BY_NAME.get(name)
    if switch is None:
        near = difflib.get_close_matches(name, BY_NAME, n=3)
        raise KeyError(f"{name} is not a shapeplan switch" + (f"; did you mean {', '.join(near)}?" if near else "")
                       + " (shapeplan env lists them)")
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return switch.default
    return parse(switch, raw)


def check_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """Warn about ``SHAPEPLAN_*`` variables no switch reads (renamed ones name their new switch); returns
    the messages. Called once when shapeplan is imported."""
    env = os.environ if environ is None else environ
    messages = []
    for name in sorted(k for k in env if k.startswith("SHAPEPLAN_") and k not in BY_NAME):
        if name in RENAMED:
            messages.append(f"{name} was renamed: set {RENAMED[name]} instead (the old name is ignored)")
        else:
            near = difflib.get_close_matches(name, BY_NAME, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            messages.append(f"{name} is not a shapeplan switch, ignored{hint}")
    for m in messages:
        warnings.warn(m, stacklevel=2)
    return messages


def _default_text(s: Switch) -> str:
    if s.default is None:
        return "unset"
    if s.type == DECODE_ATTENTION_TYPE:
        return s.default[0]
    if isinstance(s.default, bool):
        return "1" if s.default else "0"
    if isinstance(s.default, tuple):
        return "(none)"
    return str(s.default)


def markdown() -> str:
    """The README's table of switches."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | `{cell(s.type)}` | {cell(_default_text(s))} | {cell(s.meaning)} |" for s in SWITCHES]
    return "\n".join(rows) + "\n"


def listing() -> str:
    """One line per switch: name, type, default, meaning, and the value set now (``shapeplan env``)."""
    lines = []
    for s in SWITCHES:
        raw = os.environ.get(s.name)
        now = f"  [set: {raw!r}]" if raw is not None else ""
        lines.append(f"{s.name:<34} {s.type:<22} {_default_text(s):<8} {s.meaning}{now}")
    return "\n".join(lines) + "\n"


__all__ = ["BY_NAME", "RENAMED", "SWITCHES", "Switch", "SwitchError", "check_environment", "get", "listing",
           "markdown", "parse"]
