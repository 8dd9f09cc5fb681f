"""Serving benchmark (``shapeplan bench --batch N``): many requests through the serving core.

N requests of ``prompt_len`` random tokens (optionally behind a shared prefix) and ``new_tokens`` new
tokens each (EOS ignored) arrive all at once or as a Poisson process; reported: output tok/s over the
run, time to first token and inter-token latency p50/p99, prefill tokens computed, peak KV blocks used
and preemptions. ``--vs-hf`` runs transformers' continuous batching (``generate_batch``) on the same
weights in the same process; ``--sweep 1,8,...`` repeats the run per concurrency and writes a PNG plot
(throughput and ITL against concurrency) next to the JSON.
"""
from __future__ import annotations

import math
import random
import statistics
import textwrap
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from shapeplan.llm.pipeline import GenerationPipeline
from shapeplan.llm.sampling import Sampling


@dataclass(slots=True)
class ServeRow:
    name: str
    requests: int = 0
    concurrency: int = 0
    ok: bool = True
    error: str = ""
    wall_s: float = 0.0
    output_tok_s: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p99_ms: float = 0.0
    itl_p50_ms: float = 0.0
    itl_p99_ms: float = 0.0
    prefill_tokens: int = 0
    peak_blocks: int = 0
    preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def make_prompts(vocab: int, n: int, prompt_len: int, shared_prefix: int = 0, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(n)]


def run_serving(pipe: GenerationPipeline, prompts: list[list[int]], new_tokens: int, *, rate: float = 0.0,
                name: str = "shapeplan", seed: int = 0) -> ServeRow:
    """Submit every prompt (all at once, or at Poisson arrivals of ``rate`` per second), wait for all,
    and measure from the first submission to the last token."""
    row = ServeRow(name, requests=len(prompts), concurrency=pipe.max_num_seqs)
    eng = pipe.batch
    prefill0, pre0 = eng.prefill_tokens, pipe.scheduler.preemptions
    pipe.blocks.peak_used = pipe.blocks.used
    rng = random.Random(seed)
    handles, submitted = [], []
    t0 = time.perf_counter()
    for p in prompts:
        if rate > 0 and handles:
            time.sleep(rng.expovariate(rate))
        submitted.append(time.perf_counter())
        handles.append(pipe.submit(p, new_tokens, Sampling.greedy(), ignore_eos=True))
    ttft, itl, total, end = [], [], 0, t0
    for h, ts in zip(handles, submitted):
        h.wait()
        if h.finish_reason not in ("length", "stop"):
            row.ok, row.error = False, f"request {h.request_id} ended with {h.finish_reason}: {h.error}"
        last = None
        for ev in h:
            if ev.token_ids:
                if last is None:
                    ttft.append(ev.time - ts)
                else:
                    itl += [(ev.time - last) / len(ev.token_ids)] * len(ev.token_ids)
                last = ev.time
                total += len(ev.token_ids)
            end = max(end, ev.time)
    row.wall_s = end - t0
    row.output_tok_s = total / row.wall_s if row.wall_s > 0 else 0.0
    row.ttft_p50_ms, row.ttft_p99_ms = 1e3 * percentile(ttft, 50), 1e3 * percentile(ttft, 99)
    row.itl_p50_ms, row.itl_p99_ms = 1e3 * percentile(itl, 50), 1e3 * percentile(itl, 99)
    row.prefill_tokens = eng.prefill_tokens - prefill0
    row.peak_blocks = pipe.blocks.peak_used
    row.preemptions = pipe.scheduler.preemptions - pre0
    return row


def hf_serving(cfg: Any, weights: dict[str, torch.Tensor], prompts: list[list[int]], new_tokens: int,
               device: str, dtype: torch.dtype) -> ServeRow:
    """transformers' own continuous batching (``model.generate_batch``, paged attention) on the same
    weights: output tok/s over the whole call (it streams nothing, so no TTFT / ITL)."""
    row = ServeRow("transformers generate_batch", requests=len(prompts))
    try:
        from transformers import GenerationConfig, LlamaConfig as HFConfig, LlamaForCausalLM
        hf_cfg = HFConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                          intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                          num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                          head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                          rope_scaling=cfg.rope_scaling, tie_word_embeddings=cfg.tie_word_embeddings,
                          max_position_embeddings=max(4096, cfg.max_position_embeddings))
        with torch.device(device):
            model = LlamaForCausalLM(hf_cfg).to(dtype).eval()
        state = {k: v for k, v in weights.items()}
        if cfg.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        missing, unexpected = model.load_state_dict(state, strict=False)
        if [m for m in missing if "rotary" not in m] or unexpected:
            raise ValueError(f"weights do not match transformers' Llama: missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}")
        for attn in ("paged|sdpa", "sdpa_paged", "paged_attention"):
            try:
                model.set_attn_implementation(attn)
                break
            except Exception:  # noqa: BLE001, S112 - the name changed between releases
                continue
        gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0,
                               use_cuda_graph=False)
        t0 = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=gen)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        row.wall_s = time.perf_counter() - t0
        total = sum(len(getattr(o, "generated_tokens", []) or []) for o in out.values())
        row.output_tok_s = total / row.wall_s
        row.extra["tokens"] = total
    except Exception as e:  # noqa: BLE001 - the comparison must not hide our own figures
        row.ok, row.error = False, f"{type(e).__name__}: {e}"[:300]
    return row


def format_rows(rows: list[ServeRow], title: str) -> str:
    head = (f"{'engine':<28} {'conc':>5} {'reqs':>5} {'wall s':>7} {'out tok/s':>10} {'TTFT p50':>9} {'p99':>8} "
            f"{'ITL p50':>8} {'p99':>7} {'prefill':>8} {'blocks':>7} {'preempt':>7}")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        if not r.ok:
            lines.append(f"{r.name:<28} FAILED: {r.error}")
            continue
        lines.append(f"{r.name:<28} {r.concurrency:>5} {r.requests:>5} {r.wall_s:>7.2f} {r.output_tok_s:>10.0f} "
                     f"{r.ttft_p50_ms:>9.1f} {r.ttft_p99_ms:>8.1f} {r.itl_p50_ms:>8.2f} {r.itl_p99_ms:>7.2f} "
                     f"{r.prefill_tokens:>8} {r.peak_blocks:>7} {r.preemptions:>7}")
    lines.append("(TTFT/ITL in ms; prefill = prompt tokens computed; blocks = peak KV blocks held)")
    return "\n".join(lines)


def plot_sweep(rows: list[ServeRow], path: str, title: str,
               xlabel: str = "concurrency (max_num_seqs = requests)") -> bool:
    """Throughput and ITL p50/p99 against concurrency, as a PNG (False when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if r.ok]
    xs = [r.concurrency for r in ok]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [r.output_tok_s for r in ok], "o-", label="output tok/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output tok/s")
    ax2 = ax.twinx()
    ax2.plot(xs, [r.itl_p50_ms for r in ok], "s--", color="tab:orange", label="ITL p50")
    ax2.plot(xs, [r.itl_p99_ms for r in ok], "^:", color="tab:red", label="ITL p99")
    ax2.set_ylabel("inter-token latency, ms")
    fig.legend(loc="upper left")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0
