"""GenerationPipeline: prefill + decode over one compiled decoder graph with a static, in-graph KV cache.

Per request: one prefill call (the prompt padded to a bucket of a small ladder, so only a few prefill
plans exist), then one decode call per token (batch 1, seq 1: a single plan that replays). Tokens and
positions stay on the device: each step's ``next_token`` / ``next_position`` outputs are fed straight
back as the next step's inputs, so the host only synchronises every ``sync_every`` steps (plus at
tokens 0, 2 and 19, for exact metrics), which is where EOS and stop strings are checked. Decode steps
that ran past an EOS are discarded.

Every call whose results a request sees is a replay of a plan whose lifecycle has finished. A plan's
first calls (slot-by-slot, warm-up, compile, capture) run other kernels than its replays in triton
mode (torch's RMSNorm/RoPE/SiLU*mul where the replay launches Triton's, which round differently in
bf16), so the pipeline *settles* a plan before its first use: it drives the plan through those calls
on the request's own inputs (idempotent: they write the same KV rows the real call then overwrites)
and only then makes the call whose outputs it keeps. Seeded sampling is then reproducible from the
first request on (issue 6), as in vLLM, which captures its graphs before serving.
"""
from __future__ import annotations

import json
import os
import time
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch

from shapeplan import diagnostics
from shapeplan.errors import InputError, LifecycleError
from shapeplan.llm.config import LlamaConfig, preset_config
from shapeplan.llm.metrics import Metrics, compute
from shapeplan.llm.model import build_graph, initial_state
from shapeplan.llm.sampling import Sampling
from shapeplan.llm.session import GenerationResult, Session, TextStream, _until_stop  # noqa: F401
from shapeplan.llm.tokenizer import Tokenizer
from shapeplan.llm.weights import load_weights, random_weights

_METRIC_SYNCS = (0, 2, 19)


def _import_triton() -> None:
    """Import Triton (when installed) with this module, as torch is imported with it: a pipeline's
    construction then never shares the GIL with Triton's import (0.1-0.35 s of Python on the H200
    machines, where it ran on a background thread beside the graph build). Importing Triton touches no
    GPU. ``SHAPEPLAN_TRITON_EARLY_IMPORT=0`` leaves it to the first triton-mode engine, as before."""
    import importlib.util
    if os.environ.get("SHAPEPLAN_TRITON_EARLY_IMPORT", "1").strip() == "0" or importlib.util.find_spec("triton") is None:
        return
    try:
        from shapeplan.runtime.backends import triton_env  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - a broken Triton install: triton mode reports it when asked for
        pass


_import_triton()


def bucket_ladder(max_prefill_length: int, smallest: int = 16) -> list[int]:
    """Powers of two from ``smallest`` up to, and always including, ``max_prefill_length``."""
    out, b = [], smallest
    while b < max_prefill_length:
        out.append(b)
        b *= 2
    return out + [max_prefill_length]


class GenerationPipeline:
    def __init__(self, cfg: LlamaConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer | None = None, *,
                 device: str = "cpu", mode: str = "auto", dtype: torch.dtype | None = None,
                 max_prefill_length: int = 2048, max_kv_cache_length: int = 4096, sync_every: int = 8,
                 buckets: Sequence[int] | None = None, eos_token_ids: Sequence[int] | None = None,
                 prefix_cache: bool = False, optimize: bool = True, tp: Any = None, placement: Any = None) -> None:
        if max_prefill_length >= max_kv_cache_length:
            raise InputError(f"max_prefill_length ({max_prefill_length}) must be smaller than "
                             f"max_kv_cache_length ({max_kv_cache_length}): a full-length prompt would "
                             "leave no room in the KV cache to generate")
        if max_prefill_length < 1 or sync_every < 1:
            raise InputError("max_prefill_length and sync_every must be >= 1")
        self.prefix_cache = prefix_cache
        self._retained: tuple[list[int], int] = ([], 0)    # what the KV cache holds: (tokens, valid count)
        import shapeplan as sp
        self.cfg, self.tokenizer = cfg, tokenizer
        self.device = torch.device(device)
        self.dtype = dtype or cfg.torch_dtype
        self.max_prefill_length, self.max_kv_cache_length = max_prefill_length, max_kv_cache_length
        self.sync_every = sync_every
        self.buckets = sorted(b for b in (buckets or bucket_ladder(max_prefill_length)) if b <= max_prefill_length)
        if not self.buckets or self.buckets[-1] != max_prefill_length:
            self.buckets.append(max_prefill_length)
        eos = list(eos_token_ids if eos_token_ids is not None else cfg.eos_token_ids)
        if not eos and tokenizer is not None and tokenizer.eos_token_id is not None:
            eos = [tokenizer.eos_token_id]
        self.eos_token_ids = set(eos)
        self._warm_thread = None
        self._startup_done: Callable[[], None] = lambda: None
        replay_only = warm_seq = 0
        # the KV caches, sampling state and rotary tables, made before any warm-up thread starts (see
        # model.initial_state); the engine keeps them as its state
        state = initial_state(cfg, max_kv_cache_length=max_kv_cache_length, dtype=self.dtype, device=self.device) \
            if tp is None and placement is None else None
        if self.device.type == "cuda" and tp is None and placement is None:
            from shapeplan.llm import warmup            # CUDA libraries load while the graph is built
            # until the first request has settled both plans (or this pipeline is collected)
            self._startup_done = warmup.short_switch_interval()
            weakref.finalize(self, self._startup_done)
            from shapeplan.runtime import frozen_records
            # plans frozen from records never run the torch kernels that Triton replaces: skip loading
            # them when records exist (a plan without one loads them in its own slot-by-slot call)
            replay_only = mode in ("triton", "auto") and frozen_records.enabled(self.device) \
                and frozen_records.entries() > 0
            warm_seq = next(b for b in self.buckets if b >= min(128, max_prefill_length))
            self._warm_thread = warmup.start(cfg, self.dtype, self.device, max_kv_cache_length,
                                             seq=warm_seq, replay_only=replay_only,
                                             head=weights.get("lm_head.weight", weights.get("model.embed_tokens.weight")))
            if mode in ("triton", "auto"):
                _prewarm_decode_kernels(cfg, self.dtype, self.device, max_kv_cache_length)
        graph = build_graph(cfg, weights, max_kv_cache_length=max_kv_cache_length, dtype=self.dtype,
                            device=self.device, tp=tp, state=state)   # tp: parallel.TensorParallel (this rank)
        diagnostics.record("COMPILE", "graph built", nodes=len(graph.nodes))
        if placement is not None:                          # shapeplan.parallel.Placement: stages over devices
            self.engine = placement.compile(graph, mode=mode, optimize=optimize)
        else:
            # the pipeline owns its weights: a steady decode step checks a rotating chunk of them, which
            # keeps the host time per step bounded (the configuration the GPU figures were measured in)
            self.engine = sp.compile(graph, device=str(self.device), mode=mode, optimize=optimize,
                                     weight_guard="sampled", outputs=["next_token", "next_position"],
                                     adopt_variables=state is not None)
        self.graph = self.engine.graph         # the optimized graph (the built one may now be freed)
        self.mode = mode
        self._one = torch.ones(1, dtype=torch.int64, device=self.device)
        self._settled: set[tuple] = set()      # (outputs, input_ids shape) of plans past their lifecycle
        self._session: Session | None = None
        if self._warm_thread is not None and replay_only:
            self._prepare_from_records(warm_seq)

    def _prepare_from_records(self, bucket: int) -> None:
        """Start-up with frozen-plan records: while the CUDA warm-up thread still loads kernels (the main
        thread would only wait for it), freeze and compile, from their records, the plans a first
        request may use (``Engine.prepare``): the greedy decode step, the greedy prefill of the warm-up's
        bucket, of the other buckets, then the sampling decode step and prefill; it stops as soon as the
        warm-up is done. A prepared plan's first call captures at once; a plan without a record is not
        kept. Best effort: an error is recorded and changes nothing else."""
        warm = self._warm_thread
        dev = self.device
        order = [("next_token", 1), ("next_token", bucket)]
        order += [("next_token", b) for b in self.buckets if b != bucket]
        order += [("next_token_sampled", 1), ("next_token_sampled", bucket)]
        try:
            one = torch.ones(1, dtype=torch.int64, device=dev)
            for tok_out, n in order:
                if warm is None or not warm.is_alive():
                    return
                ids = torch.zeros(1, n, dtype=torch.int64, device=dev)
                if self.engine.prepare({"input_ids": ids, "position": one, "length": one},
                                       outputs=[tok_out, "next_position"]):
                    diagnostics.record("LIFECYCLE", "plan prepared from its record during the warm-up",
                                       outputs=tok_out, tokens=n)
        except Exception as e:  # noqa: BLE001 - an optimisation only: the first request records as usual
            diagnostics.record("FALLBACK", "plans not prepared from records at start-up",
                               reason=f"{type(e).__name__}: {e}"[:300])

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str, *, device: str = "cpu", dtype: torch.dtype | str | None = None,
                        progress: bool | None = None, quantize: str | None = None, **kw: Any) -> "GenerationPipeline":
        """A Hugging Face directory, or a ``.gguf`` file (``tokenizer=`` a directory or Tokenizer
        overrides the file's own; see shapeplan/importers/gguf.py). ``quantize="int8"|"int4"`` (or a
        GGUF type such as ``"Q4_K_M"``): weight-only quantization of a Hugging Face checkpoint at load
        (shapeplan/quant/recipes.py; docs/llm.md#quantization)."""
        dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if quantize and os.fspath(path).endswith(".gguf"):
            raise InputError("quantize= applies to Hugging Face checkpoints; a GGUF file keeps its own types")
        if os.fspath(path).endswith(".gguf"):
            from shapeplan.importers.gguf import read_gguf
            cfg, weights, tok = read_gguf(os.fspath(path), device=device, dtype=dt,
                                          tokenizer=kw.pop("tokenizer", None))
            return cls(cfg, weights, tok, device=device, dtype=cfg.torch_dtype, **kw)
        cfg = LlamaConfig.from_file(path)
        weights = load_weights(path, cfg, device=device, dtype=dt or cfg.torch_dtype, progress=progress)
        if quantize:
            from shapeplan.quant.recipes import quantize_weights
            quantize_weights(cfg, weights, quantize, progress=progress)
        tok = Tokenizer(path) if os.path.exists(os.path.join(path, "tokenizer.json")) else None
        gen_cfg = os.path.join(path, "generation_config.json")
        if "eos_token_ids" not in kw and os.path.exists(gen_cfg):
            with open(gen_cfg, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token_id")
            if eos is not None:
                kw["eos_token_ids"] = [eos] if isinstance(eos, int) else list(eos)
        return cls(cfg, weights, tok, device=device, dtype=dt, **kw)

    @classmethod
    def from_preset(cls, name: str, *, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0,
                    tokenizer: Tokenizer | None = None, **kw: Any) -> "GenerationPipeline":
        """Random weights with the shapes of a public model (no checkpoint needed): for benchmarks."""
        cfg = preset_config(name, dtype)
        weights = random_weights(cfg, device=device, seed=seed)
        kw.setdefault("eos_token_ids", [])
        return cls(cfg, weights, tokenizer, device=device, **kw)

    # ------------------------------------------------------------------ public API
    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, sampling: Sampling | None = None,
                 *, chat: bool = False, truncate: str | None = None,
                 on_text: Callable[[str], None] | None = None) -> GenerationResult:
        with self.start_session() as s:
            return s.generate(prompt, max_new_tokens, sampling, chat=chat, truncate=truncate, on_text=on_text)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 256, sampling: Sampling | None = None,
               **kw: Any) -> "TextStream":
        """Iterate text deltas as they are produced; ``.result`` holds the GenerationResult afterwards."""
        s = self.start_session()
        return TextStream(s.stream_tokens(prompt, max_new_tokens, sampling, **kw), self, sampling, session=s)

    def start_session(self) -> "Session":
        """A conversation whose KV cache is retained between turns. The KV buffers are the engine's
        static variables: one session holds them at a time; closing returns them (no reallocation,
        frozen plans stay valid)."""
        if self._session is not None and not self._session.closed:
            raise LifecycleError("the KV cache is held by an open session; close it (session.close() or "
                                 "`with pipe.start_session() as s:`) before starting another")
        self._session = Session(self)
        return self._session

    def clear_prefix_cache(self) -> None:
        """Forget what the KV cache holds (call after driving ``pipe.engine`` directly)."""
        self._retained = ([], 0)

    def reusable_prefix(self, ids: list[int]) -> int:
        """With ``prefix_cache``: how many leading tokens of ``ids`` already have valid K/V in the cache
        (left by the last closed session); at least one token is always prefilled, for its logits."""
        if not self.prefix_cache:
            return 0
        tokens, cached = self._retained
        n = 0
        for a, b in zip(tokens[:cached], ids[:-1]):
            if a != b:
                break
            n += 1
        return n

    def encode(self, prompt: str | Sequence[int], *, chat: bool = False, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if self.tokenizer is None:
            raise InputError("this pipeline has no tokenizer: pass token ids instead of text")
        if chat:
            prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            add_special_tokens = False
        return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    def bucket_for(self, n: int, start: int) -> int:
        for b in self.buckets:
            if b >= n and start + b <= self.max_kv_cache_length:
                return b
        return n        # near the end of the cache: an exact-length plan instead of a padded bucket

    # ------------------------------------------------------------------ the loop
    def _set_sampling(self, sampling: Sampling, context: list[int]) -> None:
        var = self.engine.variables
        var["sampling_params"].copy_(torch.tensor([sampling.as_row()], dtype=torch.float32))
        var["sampling_seed"].fill_(sampling.resolved_seed())
        seen = var["seen_tokens"]
        seen.zero_()
        if sampling.repetition_penalty != 1.0 and context:
            idx = torch.tensor([[t for t in context if 0 <= t < self.cfg.vocab_size]], dtype=torch.int64)
            seen.scatter_(1, idx.to(seen.device), True)

    def _step(self, ids: torch.Tensor, position: torch.Tensor, length: torch.Tensor, tok_out: str):
        feeds = {"input_ids": ids, "position": position, "length": length}
        outputs = [tok_out, "next_position"]
        key = (tok_out, ids.shape)
        if key not in self._settled:
            self._settle(feeds, outputs)
            self._settled.add(key)
            if ids.shape[-1] == 1:              # a decode plan has settled: the start-up is over
                self._startup_done()
        out = self.engine.run(feeds, outputs=outputs)
        return out[tok_out], out["next_position"]

    def _settle(self, feeds: dict[str, torch.Tensor], outputs: list[str], max_calls: int = 8) -> None:
        """Run the plan for these feeds until its lifecycle is over (REPLAYING, or REPLAY_BLOCKED when
        nothing captures), so the caller's next call runs the kernels every later call runs. Modes
        without a capture backend (slot_by_slot) have no lifecycle and return at once."""
        from shapeplan.runtime.runner import Phase
        eng = self.engine
        if getattr(eng, "exec_mode", None) is None or eng.exec_mode.value in ("slot_by_slot", "shape_inference_only"):
            return
        for _ in range(max_calls):
            eng.run(feeds, outputs=outputs)
            if eng.phase in (Phase.REPLAYING, Phase.REPLAY_BLOCKED):
                return

    def run_tokens(self, start: int, ids: list[int], max_new_tokens: int, sampling: Sampling,
                   context: list[int]) -> Iterator[tuple[list[int], str | None, Metrics | None]]:
        """Prefill ``ids`` at cache position ``start`` and decode. Yields (new token ids, finish reason or
        None, metrics on the last event) at every host sync."""
        n, L = len(ids), self.max_kv_cache_length
        if start + n >= L:
            raise InputError(f"the context ({start} cached + {n} new tokens) does not fit the KV cache of "
                             f"max_kv_cache_length={L} tokens with room to generate")
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        bucket = self.bucket_for(n, start)
        if self._warm_thread is not None:     # its cuBLAS handle (and workspace) then passes to this thread
            self._warm_thread.join()
            self._warm_thread = None
            diagnostics.record("COMPILE", "CUDA warm-up joined")
        greedy = sampling.is_plain_greedy
        tok_out = "next_token" if greedy else "next_token_sampled"
        if not greedy:
            self._set_sampling(sampling, context)
        seen = self.engine.variables["seen_tokens"] if sampling.repetition_penalty != 1.0 else None
        dev = self.device
        padded = torch.zeros(1, bucket, dtype=torch.int64)
        padded[0, :n] = torch.tensor(ids, dtype=torch.int64)
        max_steps = min(max_new_tokens - 1, L - 1 - (start + n))     # sequence never exceeds L tokens
        tokbuf = torch.empty(1, max_steps + 1, dtype=torch.int64, device=dev)
        eos = self.eos_token_ids
        stops = sampling.stop

        reader = _TokenReader(tokbuf)
        t_start = time.perf_counter()
        tok, pos = self._step(padded.to(dev), torch.tensor([start], dtype=torch.int64).to(dev),
                              torch.tensor([n], dtype=torch.int64).to(dev), tok_out)
        tokbuf[:, 0:1].copy_(tok)
        times: dict[int, float] = {}
        kept: list[int] = []
        requested, finish = -1, None
        step = 0
        while True:
            last = step == max_steps
            exact = step in _METRIC_SYNCS or last
            if exact or step % self.sync_every == 0:
                reader.request(requested + 1, step + 1)
                requested = step
                # wait only where a metric needs the exact time, at the end, or when the host runs
                # more than two sync intervals ahead of the device; otherwise read what is ready
                for new, upto in reader.ready(block=exact or reader.backlog > 2):
                    times[upto] = time.perf_counter()
                    added: list[int] = []
                    for t in new:
                        added.append(t)
                        if t in eos:
                            finish = "stop"
                            break
                    kept.extend(added)
                    if finish is None and stops and self.tokenizer is not None:
                        if any(s in self.decode(kept) for s in stops):
                            finish = "stop"
                    if finish is None and upto == max_steps:
                        finish = "length"
                    metrics = None
                    if finish is not None:
                        metrics = compute(t_start, times, times[upto], len(kept), prompt_tokens=n,
                                          host_syncs=reader.syncs, prefill_bucket=bucket)
                    if finish is not None:
                        self._startup_done()        # the first request is over (even without a decode step)
                    yield added, finish, metrics
                    if finish is not None:
                        return
            step += 1
            if seen is not None:
                seen.scatter_(1, tok, True)
            tok, pos = self._step(tok, pos, self._one, tok_out)
            tokbuf[:, step:step + 1].copy_(tok)


def _prewarm_decode_kernels(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, length: int) -> list:
    """Start-up: while the graph is built and optimized and the prefill plan runs, import Triton and
    start its compile workers (``triton_backend.prepare``) and compile the decode-attention kernels (two,
    each on its own warm-up thread, so a cold cache compiles them side by side in the compile workers)
    without launching them, so no capture waits for them. Off with SHAPEPLAN_TRITON_WARM=0. Returns the
    decode-attention jobs (futures)."""
    try:
        from shapeplan.ops import llm as llm_ops
        from shapeplan.runtime.backends import triton_backend
    except ImportError:
        return []
    triton_backend.prepare()
    if getattr(llm_ops, "_DECODE_ATTENTION", "auto") == "sdpa":
        return []
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def warm(part: str) -> None:
        from shapeplan.llm.decode_attention import decode_attention
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device.index)
        q = torch.empty(1, hq, 1, d, dtype=dtype, device="meta")          # layouts only: nothing on the GPU
        kv = torch.empty(1, hkv, length, d, dtype=dtype, device="meta")
        decode_attention(q, kv, kv, None, scale=d ** -0.5, window=cfg.sliding_window or 0, only=part,
                         compile_only=True)

    futures = [triton_backend.background(lambda part=part: warm(part), launches=False)
               for part in ("partial", "combine")]   # compile only: a capture on the main thread need not wait
    return [f for f in futures if f is not None]


class _TokenReader:
    """Reads slices of the device token buffer to the host. On CUDA the copy goes to pinned memory
    behind an event, so asking for tokens does not stall the device queue: they are picked up at a
    later sync point once the event has passed (or waited for, when the caller must block)."""

    def __init__(self, tokbuf: torch.Tensor) -> None:
        self.dev = tokbuf
        self.cuda = tokbuf.device.type == "cuda"
        self.host = torch.empty(tokbuf.shape, dtype=tokbuf.dtype, pin_memory=self.cuda)
        self.pending: list[tuple[Any, int, int]] = []
        self.syncs = 0

    @property
    def backlog(self) -> int:
        return len(self.pending)

    def request(self, a: int, b: int) -> None:
        """Tokens [a, b) of the buffer."""
        self.host[:, a:b].copy_(self.dev[:, a:b], non_blocking=self.cuda)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self.pending.append((event, a, b))

    def ready(self, block: bool) -> Iterator[tuple[list[int], int]]:
        """(tokens, index of the last one) per finished request, oldest first."""
        while self.pending:
            event, a, b = self.pending[0]
            if event is not None and not event.query():
                if not block:
                    return
                event.synchronize()
            self.pending.pop(0)
            self.syncs += 1
            yield self.host[0, a:b].tolist(), b - 1
