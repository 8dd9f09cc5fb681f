"""Decode benchmark shared by ``shapeplan bench`` and bench/decode.py: one set of weights, one
pipeline per execution config, greedy decode from a fixed prompt, metrics per config, and each
config's tokens checked against slot_by_slot's."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from shapeplan.llm.config import LlamaConfig, preset_config
from shapeplan.llm.metrics import Metrics
from shapeplan.llm.pipeline import GenerationPipeline
from shapeplan.llm.sampling import Sampling
from shapeplan.quant.formats import dequantized

CONFIGS = ["slot_by_slot", "emulated_replay", "cuda_graphs", "triton", "auto"]


@dataclass(slots=True)
class BenchRow:
    config: str
    ok: bool = True
    error: str = ""
    cold_start_s: float = 0.0       # pipeline construction + first (warm-up) request
    ttft_ms: float = 0.0
    overall_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    steady_tok_s: float = 0.0
    late_steady_tok_s: float = 0.0
    effective_tok_s: float = 0.0
    tokens: list[int] = field(default_factory=list)
    agree_with_reference: str = "-"   # "256/256" = identical tokens before the first divergence

    def take_metrics(self, m: Metrics) -> None:
        """Copy a request's throughputs (``shapeplan.llm.metrics.Metrics``) into this row."""
        self.ttft_ms = m.ttft_s * 1e3
        self.overall_tok_s, self.decode_tok_s = m.overall_tok_s, m.decode_tok_s
        self.steady_tok_s, self.late_steady_tok_s = m.steady_tok_s, m.late_steady_tok_s
        self.effective_tok_s = m.effective_tok_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("tokens")
        return d


def configs_for(device: str) -> list[str]:
    cuda = torch.device(device).type == "cuda"
    return [c for c in CONFIGS if cuda or c not in ("cuda_graphs", "triton")]


def bench_prompt(vocab: int, n: int) -> list[int]:
    return [(17 + i * 7919) % vocab for i in range(n)]


def load_model(preset: str | None, model: str | None, device: str, dtype: str | None):
    """(config, weights) from a preset (random weights), a checkpoint directory or a GGUF file (its
    quantized matrices stay packed). ``cfg.dtype`` is the weights' dtype."""
    if model and model.endswith(".gguf"):
        from shapeplan.importers.gguf import read_gguf
        cfg, weights, _ = read_gguf(model, device=device, dtype=getattr(torch, dtype) if dtype else None)
        return cfg, weights
    if model:
        from shapeplan.llm.weights import load_weights
        cfg = LlamaConfig.from_file(model)
        dt = getattr(torch, dtype) if dtype else cfg.torch_dtype
        cfg.dtype = str(dt).replace("torch.", "")
        return cfg, load_weights(model, cfg, device=device, dtype=dt)
    from shapeplan.llm.weights import random_weights
    cfg = preset_config(preset or "llama-125m", dtype or "bfloat16")
    return cfg, random_weights(cfg, device=device, seed=0)


def quantized(cfg: LlamaConfig, weights: dict, spec: str | None) -> dict:
    """A copy of ``weights`` quantized as ``spec`` (``recipes.tensor_types``: int8, int4, Q4_K_M, Q8_0,
    ...), made on the weights' device, the way ``shapeplan quantize`` quantizes, and laid out there as a GGUF
    load lays out the file (on a GPU: one arena, our repacked layouts); ``weights`` itself is kept (the PyTorch
    baselines read it)."""
    if not spec:
        return weights
    from shapeplan.importers.gguf import device_layout
    from shapeplan.quant.recipes import quantize_weights
    q = quantize_weights(cfg, dict(weights), spec)
    dev = next((w.device for w in weights.values() if isinstance(w, torch.Tensor)), torch.device("cpu"))
    return device_layout(cfg, q, dev)                # the arena and layouts of a loaded GGUF file


H200_COPY_BANDWIDTH = 4.23e12   # bytes/s: the H200's measured device-to-device copy, read + write counted (GPU_NOTES.md)


def copy_bandwidth() -> float:
    """Bytes/s of a decode step's bandwidth floor (weight bytes per token / this): ``H200_COPY_BANDWIDTH`` on an
    H200 (the figure the issues' targets use); on another card a 1 GiB device-to-device copy timed here (read +
    write counted, best of 10) and printed, so that "of floor" means the same there."""
    name = torch.cuda.get_device_name()
    if "H200" in name:
        return H200_COPY_BANDWIDTH
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(11):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    bw = 2 * src.numel() / best
    print(f"# copy bandwidth for the floor: {bw / 1e9:,.0f} GB/s measured on {name} (read + write)", flush=True)
    del src, dst
    torch.cuda.empty_cache()
    return bw


def cuda_graph(fn: Callable[[], Any], warmups: int = 3, reps: int = 1) -> torch.cuda.CUDAGraph:
    """``reps`` calls of ``fn`` captured into one CUDA graph, after ``warmups`` calls on a side stream
    (lazy initialisation, cuBLAS workspaces and the allocator's pools happen outside the capture).
    The torch baseline rows here and the kernel benchmarks of bench/ capture with it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return graph


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_config(cfg: LlamaConfig, weights: dict[str, torch.Tensor], config: str, *, device: str,
               prompt: list[int], new_tokens: int, max_kv_cache_length: int, max_prefill_length: int,
               sync_every: int = 16, optimize: bool = True) -> BenchRow:
    row = BenchRow(config)
    try:
        _sync(device)
        t0 = time.perf_counter()
        pipe = GenerationPipeline(cfg, weights, None, device=device, mode=config, dtype=cfg.torch_dtype,
            max_prefill_length=max_prefill_length,
            max_kv_cache_length=max_kv_cache_length, sync_every=sync_every, eos_token_ids=[],
            optimize=optimize)
        pipe.generate(prompt, max_new_tokens=min(new_tokens, 32), sampling=Sampling.greedy())   # warm-up
        _sync(device)
        row.cold_start_s = time.perf_counter() - t0
        res = pipe.generate(prompt, max_new_tokens=new_tokens, sampling=Sampling.greedy())
        row.take_metrics(res.metrics)
        row.tokens = res.token_ids
        del pipe, res
    except Exception as e:  # noqa: BLE001 - one failing config must not hide the others
        row.ok, row.error = False, f"{type(e).__name__}: {e}"[:300]
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return row


def agreement(tokens: list[int], ref: list[int]) -> str:
    same = 0
    for a, b in zip(tokens, ref):
        if a != b:
            break
        same += 1
    return f"{same}/{len(ref)}"


def run_matrix(cfg: LlamaConfig, weights: dict[str, torch.Tensor], configs: list[str], *, device: str,
               prompt_len: int = 128, new_tokens: int = 256, max_kv_cache_length: int = 1024,
               max_prefill_length: int | None = None, optimize: bool = True,
               log: Callable[[str], None] = print) -> list[BenchRow]:
    prompt = bench_prompt(cfg.vocab_size, prompt_len)
    mp = max_prefill_length or max(prompt_len, 16)
    rows: list[BenchRow] = []
    ref: list[int] | None = None
    if len(configs) > 1 and "slot_by_slot" in configs:
        configs = ["slot_by_slot"] + [c for c in configs if c != "slot_by_slot"]
    for c in configs:
        log(f"  running {c} ...")
        row = run_config(cfg, weights, c, device=device, prompt=prompt, new_tokens=new_tokens,
                         max_kv_cache_length=max_kv_cache_length, max_prefill_length=mp, optimize=optimize)
        if c == "slot_by_slot" and row.ok:
            ref = row.tokens
        elif ref is not None and row.ok:
            row.agree_with_reference = agreement(row.tokens, ref)
        rows.append(row)
    return rows


def format_table(rows: list[BenchRow], title: str = "") -> str:
    head = (f"{'config':<16} {'cold s':>7} {'TTFT ms':>8} {'overall':>8} {'decode':>8} {'steady':>8} "
            f"{'late':>8} {'effective':>9}  {'vs slot_by_slot':>15}")
    lines = [title, head, "-" * len(head)] if title else [head, "-" * len(head)]
    for r in rows:
        if not r.ok:
            lines.append(f"{r.config:<16} FAILED: {r.error}")
            continue
        lines.append(f"{r.config:<16} {r.cold_start_s:>7.2f} {r.ttft_ms:>8.1f} {r.overall_tok_s:>8.1f} "
                     f"{r.decode_tok_s:>8.1f} {r.steady_tok_s:>8.1f} {r.late_steady_tok_s:>8.1f} "
                     f"{r.effective_tok_s:>9.1f}  {r.agree_with_reference:>15}")
    lines.append("(tok/s; late = steps >= 20; cold = construction + a 32-token warm-up request)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the same decode in plain PyTorch
_SYNC_AT = (0, 2, 19)


def _timed_decode(prefill, step, n: int, tokbuf: torch.Tensor) -> tuple[dict[int, float], float, float]:
    """Run prefill then n-1 steps; sync only at tokens 0, 2, 19 and the end (same windows as ours)."""
    dev = str(tokbuf.device)
    _sync(dev)
    t0 = time.perf_counter()
    prefill()
    times: dict[int, float] = {}
    for i in range(n):
        if i:
            step(i)
        if i in _SYNC_AT or i == n - 1:
            _sync(dev)
            times[i] = time.perf_counter()
    return times, t0, times[n - 1]


def torch_baselines(cfg: LlamaConfig, weights: dict[str, torch.Tensor], prompt: list[int], n: int, max_kv: int,
                    ref: list[int] | None, device: str = "cuda") -> list[BenchRow]:
    """The same decode with a gpt-fast-style PyTorch decoder (``llm/reference.TorchDecoder``) on the same
    weights, in this process: eager; on CUDA also eager + one CUDA graph per step,
    ``torch.compile(mode="reduce-overhead")`` (static KV cache, weights marked static), and that with
    gpt-fast's int4 weight-only quantization (``llm/reference_int4``: tinygemm, group 64). Packed
    weights (a GGUF file) are dequantized for them. Same timing windows and metrics as ``run_config``;
    ``cold s`` = the step's warm-up / capture / compile."""
    cuda = torch.device(device).type == "cuda"
    kinds = ("torch eager", "torch eager+graph", "torch.compile", "torch.compile int4") if cuda else ("torch eager",)
    weights = dequantized(weights, cfg.torch_dtype)
    rows = []
    for kind in kinds:
        try:
            w = weights
            if kind.endswith("int4"):          # gpt-fast's int4 weight-only recipe (tinygemm, group 64)
                from shapeplan.llm.reference_int4 import int4_weights
                w = int4_weights(cfg, weights)
            rows.append(_torch_row(kind, cfg, w, prompt, n, max_kv, ref, device))
        except Exception as e:  # noqa: BLE001 - one failing baseline must not hide the others
            rows.append(BenchRow(kind, ok=False, error=f"{type(e).__name__}: {e}"[:300]))
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    return rows


def _torch_row(kind: str, cfg: LlamaConfig, weights: dict[str, torch.Tensor], prompt: list[int], n: int,
               max_kv: int, ref: list[int] | None, dev: str) -> BenchRow:
    from shapeplan.llm.metrics import compute
    from shapeplan.llm.reference import TorchDecoder
    row = BenchRow(kind)
    dec = TorchDecoder(cfg, weights, max_kv_cache_length=max_kv, device=dev,
                       dtype=weights["model.embed_tokens.weight"].dtype)
    static = [t for v in weights.values() for t in ([v] if isinstance(v, torch.Tensor) else v.tensors())]
    ids = torch.tensor([prompt], device=dev)
    P = len(prompt)
    tok = torch.zeros(1, 1, dtype=torch.int64, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    tokbuf = torch.zeros(1, n, dtype=torch.int64, device=dev)
    counter = torch.zeros(1, dtype=torch.int64, device=dev)

    def prefill() -> None:
        first = dec.forward(ids, torch.arange(P, device=dev)).argmax(-1, keepdim=True)
        tok.copy_(first)
        pos.fill_(P)
        tokbuf[:, 0:1].copy_(first)
        counter.fill_(1)

    step_fn = dec.decode_step

    def body() -> None:                              # one decode step, all state on the device
        nxt = step_fn(tok, pos)
        tok.copy_(nxt)
        tokbuf.index_copy_(1, counter, nxt)
        pos.add_(1)
        counter.add_(1)

    def eager(i: int) -> None:
        body()
    run = eager
    t_cold = time.perf_counter()
    if kind == "torch eager+graph":
        prefill()
        graph = cuda_graph(body)

        def replay(i: int) -> None:
            graph.replay()
        run = replay
    elif kind.startswith("torch.compile"):
        extra = [t for t in dec.qkv + dec.qkv_bias + dec.gate_up if isinstance(t, torch.Tensor)]
        for t in static + extra + dec.k + dec.v + [tok, pos, tokbuf, counter]:
            torch._dynamo.mark_static_address(t)
        step_fn = torch.compile(dec.decode_step, mode="reduce-overhead", fullgraph=True)
        prefill()
        for _ in range(4):                           # compile, record, replay
            body()
    _sync(dev)
    row.cold_start_s = time.perf_counter() - t_cold
    times, t0, t_end = _timed_decode(prefill, run, n, tokbuf)
    row.take_metrics(compute(t0, times, t_end, n))
    row.tokens = tokbuf[0].tolist()
    if ref is not None:
        row.agree_with_reference = agreement(row.tokens, ref)
    return row
