"""GenerationPipeline: a Llama-family model over the serving core (shapeplan/llm/batch).

The pipeline compiles one decoder graph with a paged KV cache (model.build_graph(paged=...)) into one
engine and builds the serving core around it: a block pool sized by ``kv_cache_bytes``, the prefix
cache over its blocks, the scheduler (continuous batching, chunked prefill, preemption) and the engine
thread that owns every engine call. ``generate`` / ``stream`` / sessions are clients of that core (one
request each; a batch of one is bucket 1, the single-stream plan), ``generate_batch`` submits many at
once and ``submit`` hands back a streaming, abortable handle for servers. Tokens and positions stay
on the device within a decode round: the host reads tokens back every ``sync_every`` steps (and at
tokens 0, 2 and 19 of each request, for exact metrics), which is where EOS and stop strings are
checked; steps a request ran past its end are discarded.

Every call whose results a request sees is a replay of a plan whose lifecycle has finished: each
bucket's plan is first driven through warm-up and capture on padding rows, which write nothing
(``ModelRunner.settle``; ``pipe.warmup()`` does every bucket up front, as a server does before its
first request). Seeded sampling is reproducible: a row's noise depends only on its seed and position.
"""
from __future__ import annotations

import inspect
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from shapeplan import diagnostics, env
from shapeplan.errors import InputError
from shapeplan.llm.batch import BatchEngine, BlockManager, ModelRunner, RequestHandle, Scheduler, decode_buckets
from shapeplan.llm.batch.constrained import Structured
from shapeplan.llm.config import LlamaConfig, eos_ids, preset_config, read_json
from shapeplan.llm.model import PagedKV, build_graph, initial_state, layers_x_codes
from shapeplan.llm.sampling import Sampling
from shapeplan.llm.session import GenerationResult, Session, TextStream, _until_stop  # noqa: F401
from shapeplan.llm.tokenizer import Tokenizer
from shapeplan.llm.weights import StreamedLoad, load_weights, random_weights, streaming

_METRIC_SYNCS = (0, 2, 19)


def _import_triton() -> None:
    """Import Triton (when installed) with this module, as torch is imported with it: a pipeline's
    construction then never shares the GIL with Triton's import (0.1-0.35 s of Python on the slow H200
    machine, where it ran on a background thread beside the graph build; docs/gpu.md). Importing Triton
    touches no GPU and patches nothing: its hooks go in when a triton-mode engine is created
    (``triton.env.patch``). ``SHAPEPLAN_TRITON_EARLY_IMPORT=0`` leaves the import to that engine, and so
    does a CPU-only build of torch (``torch.version.cuda`` None: no GPU kernel can run, and on the CPU box
    the import was 0.13 s of ``shapeplan generate --device cpu``'s start)."""
    import importlib.util
    if not env.get("SHAPEPLAN_TRITON_EARLY_IMPORT") or torch.version.cuda is None \
            or importlib.util.find_spec("triton") is None:
        return
    try:
        from shapeplan.runtime.backends.triton import env as triton_env  # noqa: F401 - Triton, its cache under ours
    except Exception:  # noqa: BLE001, S110 - a broken Triton install: triton mode reports it when asked for
        pass


_import_triton()


def prefill_buckets(max_prefill_length: int, buckets: Sequence[int] | None = None) -> list[int]:
    """The prefill buckets: ``buckets`` (default ``bucket_ladder``) up to and always including
    ``max_prefill_length``."""
    out = sorted(b for b in (buckets or bucket_ladder(max_prefill_length)) if b <= max_prefill_length)
    if not out or out[-1] != max_prefill_length:
        out.append(max_prefill_length)
    return out


@dataclass(slots=True)
class CudaWarmup:
    """A started CUDA warm-up (``llm/warmup.py``): its thread, whether it warms only what a replay from
    frozen-plan records runs, its prefill length, and the release of the short GIL switch interval."""
    thread: threading.Thread | None
    replay_only: bool
    seq: int
    release: Callable[[], None]


def start_cuda_warmup(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, mode: str, buckets: list[int],
                      max_kv_cache_length: int, block_size: int, head: torch.Tensor | None) -> CudaWarmup:
    """Start the pipeline's CUDA warm-up: in ``__init__`` (while the graph is built), or earlier in
    ``from_pretrained`` (while the weights load; ``head`` may then still be loading: the warm-up only
    reads it, and its results are unused)."""
    from shapeplan.llm import warmup
    from shapeplan.runtime import frozen_records
    release = warmup.short_switch_interval()
    # plans frozen from records never run the torch kernels that Triton replaces: skip loading
    # them when records exist (a plan without one loads them in its own slot-by-slot call)
    replay_only = mode in ("triton", "auto") and frozen_records.enabled(device) and frozen_records.entries() > 0
    seq = next(b for b in buckets if b >= min(128, buckets[-1]))
    thread = warmup.start(cfg, dtype, device, max_kv_cache_length, seq=seq, replay_only=replay_only,
                          block_size=block_size, head=head)
    return CudaWarmup(thread, replay_only, seq, release)


def bucket_ladder(max_prefill_length: int, smallest: int = 16) -> list[int]:
    """Powers of two from ``smallest`` up to, and always including, ``max_prefill_length``."""
    out, b = [], smallest
    while b < max_prefill_length:
        out.append(b)
        b *= 2
    return out + [max_prefill_length]


def _tokenizer_thread(dev: torch.device) -> bool:
    """Whether from_pretrained parses tokenizer.json on a thread (``SHAPEPLAN_TOKENIZER_THREAD``: only with
    ``on``; auto is off on every device). ``tokenizers`` holds the GIL while it parses (a Python loop beside a
    128,256-entry parse stalls for the whole parse, 0.24 s on the dev box), so the thread only moves the parse's
    time into whatever Python work runs beside it: on the H200 the weights load slowed by what the parse saved
    (twentieth session), on the CPU "config + tokenizer" 0.25 -> 0.001 s and "weights" 0.002 -> 0.27 s (twenty-
    first session; docs/benchmarks/decode.md)."""
    del dev                                          # (the same on every device)
    return env.get("SHAPEPLAN_TOKENIZER_THREAD") == "on"


def _cpu_unpack(weights: dict[str, Any], dtype: torch.dtype, memory: int | None = None) -> bool:
    """Whether a CPU pipeline dequantizes its quantized weights once (``SHAPEPLAN_QUANT_CPU``; auto: when
    they take at most a quarter of ``memory``, the machine's, in ``dtype``). Per call, a decode step
    dequantizes every matrix in float32 first: llama-125m Q4_K_M ran 2.5-3.2 tok/s that way on the dev box
    and 17-23 tok/s dequantized once (bf16), with a lower peak RSS (729-755 against 1,230 MB: no per-call
    float32 temporaries); an 8b model's float weights (16 GB) stay packed on a 24 GB machine."""
    from shapeplan.quant.formats import QuantWeight
    mode = env.get("SHAPEPLAN_QUANT_CPU")
    quant = [w for w in weights.values() if isinstance(w, QuantWeight)]
    if mode == "packed" or not quant:
        return False
    if mode == "unpack":
        return True
    dense = sum(w.shape[0] * w.shape[1] for w in quant) * dtype.itemsize
    if memory is None:
        try:
            memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return False
    return dense <= memory // 4


#: the CPU's smallest decode bucket: every decode GEMM then has M >= 16, one kernel path of the CPU BLAS,
#: so a row's logits do not depend on how many other rows run beside it (batched == alone, exactly)
CPU_MIN_DECODE_BUCKET = 16


def default_prefix_cache_bytes(device: torch.device) -> int:
    """10 % of the device's memory clamped to 64-512 MiB; 256 MiB where the size is unknown (CPU)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(min(512 << 20, max(64 << 20, total // 10)))
    return 256 << 20


def kv_bytes_per_token(cfg: LlamaConfig, dtype: torch.dtype) -> int:
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


class GenerationPipeline:
    def __init__(self, cfg: LlamaConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer | None = None, *,
                 device: str = "cpu", mode: str = "auto", dtype: torch.dtype | None = None,
                 max_prefill_length: int = 2048, max_kv_cache_length: int = 4096, sync_every: int = 8,
                 buckets: Sequence[int] | None = None, eos_token_ids: Sequence[int] | None = None,
                 prefix_cache: bool = True, optimize: bool = True, tp: Any = None, placement: Any = None,
                 max_num_seqs: int = 64, kv_cache_bytes: int | None = None, block_size: int = 16,
                 max_num_batched_tokens: int | None = None, prefix_cache_bytes: int | None = None,
                 max_waiting: int = 4096, _warmup: CudaWarmup | None = None) -> None:
        t_start = time.perf_counter()
        #: seconds per start-up phase (``shapeplan generate --timings``); from_pretrained adds its own first
        self.timings: dict[str, float] = {}
        if max_prefill_length >= max_kv_cache_length:
            raise InputError(f"max_prefill_length ({max_prefill_length}) must be smaller than "
                             f"max_kv_cache_length ({max_kv_cache_length}): a full-length prompt would "
                             "leave no room in the KV cache to generate")
        if max_prefill_length < 1 or sync_every < 1 or max_num_seqs < 1 or block_size < 1:
            raise InputError("max_prefill_length, sync_every, max_num_seqs and block_size must be >= 1")
        import shapeplan as sp
        self.cfg, self.tokenizer = cfg, tokenizer
        self.device = torch.device(device)
        self.dtype = dtype or cfg.torch_dtype
        if self.device.type == "cpu" and _cpu_unpack(weights, self.dtype):
            from shapeplan.quant.formats import dequantized
            weights = dequantized(weights, self.dtype)
        self.max_prefill_length, self.max_kv_cache_length = max_prefill_length, max_kv_cache_length
        self.sync_every, self.max_num_seqs, self.block_size = sync_every, max_num_seqs, block_size
        self.prefix_cache = prefix_cache
        self.buckets = prefill_buckets(max_prefill_length, buckets)
        eos = list(eos_token_ids if eos_token_ids is not None else cfg.eos_token_ids)
        if not eos and tokenizer is not None and tokenizer.eos_token_id is not None:
            eos = [tokenizer.eos_token_id]
        self._eos = set(eos)
        per_token = kv_bytes_per_token(cfg, self.dtype) // (tp.world_size if tp is not None else 1)   # this rank's
        per_block = per_token * block_size
        max_blocks = -(-max_kv_cache_length // block_size)
        self.prefix_cache_bytes = default_prefix_cache_bytes(self.device) if prefix_cache_bytes is None \
            else prefix_cache_bytes
        num_blocks = self._pool_blocks(kv_cache_bytes, per_block, max_blocks)
        self.kv_cache_bytes = num_blocks * per_block
        self.paged = PagedKV(num_blocks=num_blocks, block_size=block_size, max_blocks=max_blocks,
                             state_slots=max_num_seqs + 1)
        self._warm_thread = None
        kernel_records_done = None               # ends the start-up's Triton kernel records (SHAPEPLAN_TRITON_PRELOAD)
        self._startup_done: Callable[[], None] = lambda: None
        state = initial_state(cfg, max_kv_cache_length=max_kv_cache_length, dtype=self.dtype, device=self.device,
                              paged=self.paged) if tp is None and placement is None else None
        replay_only, warm_seq = False, 0
        if self.device.type == "cuda" and tp is None and placement is None:
            # CUDA libraries load while the graph is built (or already while the weights loaded)
            warm = _warmup or start_cuda_warmup(
                cfg, self.dtype, self.device, mode, self.buckets, max_kv_cache_length, block_size,
                head=weights.get("lm_head.weight", weights.get("model.embed_tokens.weight")))
            self._warm_thread, replay_only, warm_seq = warm.thread, warm.replay_only, warm.seq
            self._startup_done = warm.release
            weakref.finalize(self, self._startup_done)
            if mode in ("triton", "auto"):
                kernel_records_done = _preload_kernels(self.device, cfg, self.dtype, self.paged, mode,
                                                       self.buckets, max_num_seqs)
                _prewarm_decode_kernels(cfg, self.dtype, self.device, self.paged,
                                        x_codes=set(layers_x_codes(cfg, weights, self.device)))
        graph = build_graph(cfg, weights, max_kv_cache_length=max_kv_cache_length, dtype=self.dtype,
                            device=self.device, tp=tp, state=state, paged=self.paged)
        diagnostics.record("COMPILE", "graph built", nodes=len(graph.nodes))
        t_graph = time.perf_counter()
        self.timings["graph"] = t_graph - t_start
        if placement is not None:                          # shapeplan.parallel.Placement: stages over devices
            self.engine = placement.compile(graph, mode=mode, optimize=optimize)
        else:
            # the pipeline owns its weights: a steady decode step checks a rotating chunk of them, which
            # keeps the host time per step bounded (the configuration the GPU figures were measured in)
            self.engine = sp.compile(graph, device=str(self.device), mode=mode, optimize=optimize,
                                     weight_guard="sampled", outputs=["next_token", "next_position"],
                                     adopt_variables=state is not None)
        self.graph = self.engine.graph         # the optimized graph (the built one may now be freed)
        t_compiled = time.perf_counter()
        self.timings["compile"] = t_compiled - t_graph
        self.mode = mode
        smallest = CPU_MIN_DECODE_BUCKET if self.device.type == "cpu" else 1
        self.decode_buckets = decode_buckets(max_num_seqs, smallest)
        kv_blocks = state["kv.blocks"] if state is not None else None
        self.runner = ModelRunner(self.engine, self.paged, self.device, decode_buckets=self.decode_buckets,
                                  prefill_buckets=self.buckets, kv_blocks=kv_blocks,
                                  before_first_call=_weak_call(self._join_warmup),
                                  after_first_decode=kernel_records_done)
        # constrained decoding (Sampling(constraint=...)): xgrammar and the masked sampler load at first use
        self.structured = self.runner.structured = Structured(self.runner, tokenizer, cfg.vocab_size, mode)
        self.blocks = BlockManager(num_blocks, block_size, per_block, prefix_cache=prefix_cache,
                                   cache_budget_bytes=self.prefix_cache_bytes)
        batched = max_num_batched_tokens or max(max_prefill_length, 2048)
        self.scheduler = Scheduler(self.blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=batched,
                                   max_prefill_length=max_prefill_length, max_model_len=max_kv_cache_length,
                                   sync_every=sync_every)
        self.batch = BatchEngine(self.runner, self.scheduler, self.blocks, vocab_size=cfg.vocab_size,
                                 max_model_len=max_kv_cache_length, eos_token_ids=sorted(self._eos),
                                 decode_text=tokenizer.decode if tokenizer is not None else None,
                                 max_waiting=max_waiting, structured=self.structured)
        weakref.finalize(self, self.batch.close)
        if self._warm_thread is not None and replay_only:
            self.batch.post(_weak_call(self._prepare_from_records, warm_seq))
        self.timings["serving core"] = time.perf_counter() - t_compiled

    def _prepare_from_records(self, bucket: int) -> None:
        """Start-up with frozen-plan records (engine thread): while the CUDA warm-up thread still loads
        kernels, freeze and compile, from their records, the plans a first request may use
        (``Engine.prepare``): the greedy decode step of the smallest bucket, the greedy prefill of the
        warm-up's bucket, of the other buckets, then the sampled decode step and prefill; it stops as
        soon as the warm-up is done. A prepared plan's first call captures at once; a plan without a
        record is not kept. Best effort: an error is recorded and changes nothing else."""
        warm = self._warm_thread
        rows = self.decode_buckets[0]
        order = [("next_token", rows, 1), ("next_token", 1, bucket)]
        order += [("next_token", 1, b) for b in self.buckets if b != bucket]
        order += [("next_token_sampled", rows, 1), ("next_token_sampled", 1, bucket)]
        try:
            for out, n_rows, n in order:
                if warm is None or not warm.is_alive():
                    return
                if self.engine.prepare(self.runner.padding_feeds(n_rows, n), outputs=[out, "next_position"]):
                    diagnostics.record("LIFECYCLE", "plan prepared from its record during the warm-up",
                                       outputs=out, rows=n_rows, tokens=n)
        except Exception as e:  # noqa: BLE001 - an optimisation only: the first request records as usual
            diagnostics.record("FALLBACK", "plans not prepared from records at start-up",
                               reason=f"{type(e).__name__}: {e}"[:300])

    def _pool_blocks(self, kv_cache_bytes: int | None, per_block: int, max_blocks: int) -> int:
        """The pool's block count: ``kv_cache_bytes`` worth, or by default room for ``max_num_seqs``
        requests of the full context (capped at 90 % of the free device memory on CUDA, 4 GiB on the
        CPU); never less than one full-length request. Cached prefixes live in the same pool."""
        if kv_cache_bytes is not None:
            n = kv_cache_bytes // per_block
        else:
            want = self.max_num_seqs * max_blocks
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                cap = int(free * 0.9) // per_block
            else:
                cap = (4 << 30) // per_block
            n = min(want, cap)
        n = int(n) + 1                                      # + the null block
        if n < max_blocks + 1:
            raise InputError(f"kv_cache_bytes: {self.kv_cache_bytes_hint(per_block, max_blocks)} is the least for "
                             f"one request of max_kv_cache_length={self.max_kv_cache_length} tokens "
                             f"({max_blocks} blocks of {self.block_size}); got room for {n - 1} blocks")
        return n

    @staticmethod
    def kv_cache_bytes_hint(per_block: int, max_blocks: int) -> int:
        return per_block * max_blocks

    def _join_warmup(self) -> None:
        """Before the first engine call of a request: the CUDA warm-up thread's cuBLAS handle (and
        workspace) then passes to the engine thread."""
        if self._warm_thread is not None:
            t0 = time.perf_counter()
            self._warm_thread.join()
            self._warm_thread = None
            self.timings["warm-up wait"] = time.perf_counter() - t0
            diagnostics.record("COMPILE", "CUDA warm-up joined")

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
        clock = [time.perf_counter()]
        timings: dict[str, float] = {}

        def lap(phase: str) -> None:
            now = time.perf_counter()
            timings[phase] = timings.get(phase, 0.0) + now - clock[0]
            clock[0] = now
        cfg = LlamaConfig.from_file(path)
        dev, target = torch.device(device), dt or cfg.torch_dtype
        tok = Tokenizer(path, background=_tokenizer_thread(dev)) \
            if os.path.exists(os.path.join(path, "tokenizer.json")) else None
        gen_cfg = os.path.join(path, "generation_config.json")
        if "eos_token_ids" not in kw and os.path.exists(gen_cfg):
            eos = read_json(gen_cfg).get("eos_token_id")
            if eos is not None:
                kw["eos_token_ids"] = eos_ids(eos, gen_cfg)
        lap("config + tokenizer")
        warm = None
        if streaming(dev) and not quantize and kw.get("tp") is None and kw.get("placement") is None \
                and dev.type == "cuda" and env.get("SHAPEPLAN_WARM_DURING_LOAD") and warmup_enabled():
            # the destinations first (CUDA starts here), then the warm-up, then the reads it overlaps
            load = StreamedLoad(path, cfg, dev, target, progress)
            lap("weights")
            init = _init_defaults()
            arg = lambda name: kw.get(name, init[name])  # noqa: E731
            warm = start_cuda_warmup(cfg, target, dev, arg("mode"),
                                     prefill_buckets(arg("max_prefill_length"), arg("buckets")),
                                     arg("max_kv_cache_length"), arg("block_size"), head=load.head)
            lap("warm-up start")
            try:
                weights = load.run()
            except BaseException:
                warm.release()
                raise
        else:
            weights = load_weights(path, cfg, device=device, dtype=target, progress=progress)
        lap("weights")
        if quantize:
            from shapeplan.quant.recipes import quantize_weights
            quantize_weights(cfg, weights, quantize, progress=progress)
            lap("quantize")
        try:
            pipe = cls(cfg, weights, tok, device=device, dtype=dt, _warmup=warm, **kw)
        except BaseException:
            if warm is not None:
                warm.release()
            raise
        if tok is not None:                          # a parse on a thread or in a helper process: its end
            t_wait = time.perf_counter()
            try:
                tok.wait()
            except BaseException:
                pipe.close()
                raise
            pipe.timings["tokenizer wait"] = time.perf_counter() - t_wait
        pipe.timings = {**timings, **pipe.timings}
        return pipe

    @classmethod
    def from_preset(cls, name: str, *, device: str = "cpu", dtype: str = "bfloat16", seed: int = 0,
                    tokenizer: Tokenizer | None = None, **kw: Any) -> "GenerationPipeline":
        """Random weights with the shapes of a public model (no checkpoint needed): for benchmarks."""
        cfg = preset_config(name, dtype)
        weights = random_weights(cfg, device=device, seed=seed)
        kw.setdefault("eos_token_ids", [])
        return cls(cfg, weights, tokenizer, device=device, **kw)

    # ------------------------------------------------------------------ public API
    @property
    def eos_token_ids(self) -> set[int]:
        return self._eos

    @eos_token_ids.setter
    def eos_token_ids(self, ids: Sequence[int]) -> None:
        self._eos = set(ids)
        self.batch.eos = frozenset(self._eos)

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
        """A conversation whose KV cache is kept between turns: each turn continues from the blocks the
        last one left (held by the session, so no other request can evict them), and closing the
        session gives them back. Any number of sessions can be open at once."""
        return Session(self)

    def submit(self, prompt: str | Sequence[int], max_new_tokens: int = 256, sampling: Sampling | None = None, *,
               chat: bool = False, ignore_eos: bool = False, logprobs: int | None = None) -> RequestHandle:
        """Queue one request and return at once. The handle yields ``TokenEvent``s (new token ids, and
        the finish reason on the last one) as the engine produces them, ``for ev in handle`` or, when
        submitted from inside an asyncio loop, ``async for ev in handle``; ``handle.abort()`` stops it
        and frees its KV blocks at the next step. ``ignore_eos``: run to ``max_new_tokens`` (benchmarks).
        ``logprobs=K`` (0 to 20): each event also carries its tokens' log-probabilities and the K most
        likely tokens at each position (``TokenEvent.logprobs``)."""
        ids = self.encode(prompt, chat=chat)
        return self.batch.submit(ids, max_new_tokens=max_new_tokens, sampling=sampling or Sampling.greedy(),
                                 ignore_eos=ignore_eos, logprobs=logprobs)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 256,
                       sampling: Sampling | Sequence[Sampling] | None = None, *, chat: bool = False,
                       ignore_eos: bool = False) -> list[GenerationResult]:
        """Generate for every prompt at once (continuous batching); one GenerationResult per prompt, in
        order. ``sampling``: one setting for all, or one per prompt."""
        if isinstance(sampling, Sampling) or sampling is None:
            samplings = [sampling or Sampling.greedy()] * len(prompts)
        else:
            samplings = list(sampling)
            if len(samplings) != len(prompts):
                raise InputError(f"generate_batch: {len(prompts)} prompts but {len(samplings)} sampling settings")
        handles = [self.submit(p, max_new_tokens, s, chat=chat, ignore_eos=ignore_eos)
                   for p, s in zip(prompts, samplings)]
        return [self._result(h, s) for h, s in zip(handles, samplings)]

    def _result(self, handle: RequestHandle, sampling: Sampling) -> GenerationResult:
        handle.wait()
        handle.raise_for_error()
        ids = _until_eos(handle.token_ids, self._eos)
        text = _until_stop(self.decode(ids), sampling.stop, hold=False)
        return GenerationResult(text, ids, handle.prompt_token_ids, handle.finish_reason, handle.metrics)

    def score(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """The logits at every position of ``prompt`` ([n, V], float, on the CPU): one prefill through
        the ``all_logits`` output, in blocks taken for the call and given back after it."""
        ids = self.encode(prompt)
        n = len(ids)
        if not 0 < n <= self.max_prefill_length:
            raise InputError(f"score: the prompt must have 1 to max_prefill_length={self.max_prefill_length} "
                             f"tokens, got {n}")

        def run() -> torch.Tensor:
            blocks = self.blocks.allocate(self.blocks.blocks_for(n))
            try:
                return self.runner.score(ids, blocks).float().cpu()
            finally:
                self.blocks.release(blocks)
        return self.batch.call(run)

    def compile_constraint(self, constraint: Any) -> None:
        """Compile ``constraint`` for this pipeline's tokenizer now (cached: a later request with it starts
        at once); raises ``ConstraintError`` naming the problem. ``submit`` compiles on the caller's
        thread; a server calls this from a worker thread first to keep its event loop free."""
        self.structured.start(constraint, self.batch.eos)

    def warmup(self, sampled: bool = True, structured: bool = False) -> None:
        """Capture every decode bucket's plan (and the sampled variant) and every prefill bucket's now,
        so no request waits for a capture (``shapeplan serve`` calls this before it listens);
        ``structured``: also the plans of constrained requests (the forward's ``logits`` variants and the
        masked sampler: batch/constrained.py)."""
        budget = self.scheduler.max_num_batched_tokens
        self.batch.call(lambda: self.runner.warmup(sampled, budget))
        if structured:
            self.batch.call(lambda: self.structured.warmup(self.batch.eos))

    def prefix_cache_stats(self) -> dict:
        """block_size, max_byte_budget, resident_blocks, current_bytes, total_lookups, total_hits, hit_rate,
        total_hit_tokens, total_stored_tokens (lookup counters are lifetime; ``clear_prefix_cache``
        zeroes the gauges only), plus idle_blocks (cached blocks no request holds)."""
        return self.batch.call(self.blocks.cache_stats)

    def kv_stats(self) -> dict:
        """The block pool now: blocks in all, held by requests, free, and the scheduler's queues."""
        def read() -> dict:
            b, sc = self.blocks, self.scheduler
            return {"blocks_total": b.usable_blocks, "blocks_used": b.used, "blocks_free": b.available,
                    "running": len(sc.running), "prefilling": len(sc.prefilling), "waiting": len(sc.waiting),
                    "preemptions": sc.preemptions}
        return self.batch.call(read)

    def clear_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks held by requests and sessions stay theirs)."""
        self.batch.call(self.blocks.clear)

    def close(self) -> None:
        """Stop the engine thread (pending requests are left unanswered)."""
        self.batch.close()

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


def warmup_enabled() -> bool:
    from shapeplan.llm import warmup
    return warmup.enabled()


_INIT_DEFAULTS: dict[str, Any] = {}


def _init_defaults() -> dict[str, Any]:
    """``GenerationPipeline.__init__``'s keyword defaults (from_pretrained starts the warm-up with them)."""
    if not _INIT_DEFAULTS:
        params = inspect.signature(GenerationPipeline.__init__).parameters.values()
        _INIT_DEFAULTS.update({p.name: p.default for p in params if p.default is not inspect.Parameter.empty})
    return _INIT_DEFAULTS


def _weak_call(method: Callable[..., Any], *args: Any) -> Callable[[], None]:
    """``method(*args)`` through a weak reference to its object: the engine thread's callbacks must not
    keep a pipeline alive (its finalizer stops that thread and frees the device memory)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        m = ref()
        if m is not None:
            m(*args)
    return call


def _until_eos(ids: list[int], eos: set[int]) -> list[int]:
    cut = next((i + 1 for i, t in enumerate(ids) if t in eos), None)
    return ids[:cut] if cut else list(ids)


def _preload_kernels(device: torch.device, *context: Any) -> Callable[[], None] | None:
    """With ``SHAPEPLAN_TRITON_PRELOAD``: load the Triton kernels the last start-up of this ``context`` (model
    configuration, dtype, KV cache, mode, buckets) recorded on a warm-up thread (a capture waits for it), and
    record this start-up's until its first decode call returns (triton/preload.py). Returns what ends the
    records (None: not recording)."""
    try:
        from shapeplan.runtime.backends.triton import preload
        from shapeplan.runtime.backends.triton import warmup as triton_warmup
    except ImportError:
        return None
    if not preload.install():                # off, interpreting, or a Triton it does not know
        return None
    key = preload.context_key(*context)
    preload.start_recording(key)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if preload.records(key):
        triton_warmup.background(lambda: preload.preload(key, index))
    return preload.finish_recording


def _prewarm_decode_kernels(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, paged: PagedKV,
                            batch: int = 1, x_codes: set[bool] = frozenset({False})) -> list:
    """Start-up: while the graph is built and optimized and the first prefill runs, import and patch
    Triton and start its compile workers (``triton.warmup.prepare``) and compile the paged decode
    kernels of the smallest decode bucket (the prefill's KV write, the decode step's write + attention, the
    greedy pick's ArgMax; each on its own
    warm-up thread, so a cold cache compiles them side by side in the compile workers) without
    launching them, so no capture waits for them (the decode kernel once per ``x_codes`` value its layers
    take: ``model.layers_x_codes``). Off with SHAPEPLAN_TRITON_WARM=0. Returns the jobs (futures)."""
    try:
        from shapeplan.runtime.backends.triton import warmup as triton_warmup
    except ImportError:
        return []
    triton_warmup.prepare()

    def warm(part: str, codes: bool = False) -> None:
        from shapeplan.runtime.backends.triton import env as triton_env
        # patched first: a triton-mode pipeline compiles in the workers, and the kernel modules imported next
        # take their source lines from the records of jit_keys.py (when on)
        triton_env.patch()
        from shapeplan.runtime.backends.triton.kernels import argmax as argmax_kernels
        from shapeplan.runtime.backends.triton.kernels import paged as paged_kernels
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device.index)
        if part == "argmax":                           # the greedy pick over the vocabulary
            argmax_kernels.precompile(batch, cfg.vocab_size, dtype)
            return
        paged_kernels.precompile(part, batch=batch, hq=cfg.num_heads, hkv=cfg.num_kv_heads, d=cfg.head_dim,
                                 block_size=paged.block_size, max_blocks=paged.max_blocks,
                                 num_blocks=paged.num_blocks, dtype=dtype, window=cfg.sliding_window or 0,
                                 x_codes=codes)

    parts = [("write", False), *(("decode", c) for c in sorted(x_codes)), ("argmax", False)]
    futures = [triton_warmup.background(lambda part=part, c=c: warm(part, c), launches=False)
               for part, c in parts]                    # compile only: a capture need not wait
    return [f for f in futures if f is not None]
