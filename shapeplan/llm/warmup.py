"""Start-up: load the CUDA libraries and kernels a model's first call uses while the pipeline is built.

A fresh process pays on the first use of each CUDA library and kernel: cuBLAS's initialisation, the
attention kernels, each elementwise kernel's module (CUDA loads modules lazily). On the H200 that is
0.3-0.4 s of the llama-1b pipeline's first (slot-by-slot) prefill call, against ~0.03 s for the same
call once they are loaded (docs/benchmarks/decode.md round 5). So, on CUDA, the pipeline starts a thread that
calls the model's own op kernels (the registered ones the plan will run) once, on zero tensors with the
model's hidden and MLP sizes, heads, dtype and KV length: the same kernels, loaded while the main thread
builds and optimizes the graph. The kernels are called in five independent parts (``parts``: GEMMs,
attention, index ops, the KV cache write, elementwise), each on its own thread (``SHAPEPLAN_CUDA_WARM_THREADS``:
1 runs them one after another),
so each part's libraries and modules load beside the others' instead of after them
(docs/benchmarks/decode.md round 7: on the H200 the first GEMM, the first attention, the first gathers and
the first ArgMax each cost 40-110 ms, one after another ~0.43 s). The threads do almost no Python work
(a first version ran a one-layer copy of the model through the engine; its graph build competed with
the main thread's for the GIL and gained nothing); torch releases the GIL inside its kernels, so the
loading overlaps construction.

The pipeline joins the thread before its first request runs: torch keeps one cuBLAS handle per thread
and a 32 MiB workspace per handle, and a handle released by a finished thread is the one the next
thread takes, so the request's thread reuses it instead of allocating a second workspace (measured:
+33.6 MB of memory beyond weights when the two overlapped). The thread holds the device's capture lock while it launches, so no CUDA graph capture in the process
runs beside it (a capture waits for it). It warms the prefill only: a decode step would wait for the
decode-attention kernels, which a cold start is still compiling. Best effort: a failure is recorded
and changes nothing else. Memory: one layer's weights, freed when it ends (only the GEMM part uses
cuBLAS, so one handle and workspace, as before). ``SHAPEPLAN_CUDA_WARM=0`` turns it off.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable

import torch

from shapeplan import diagnostics, env
from shapeplan.llm.config import LlamaConfig

#: (part name, start, end) in time.perf_counter seconds, of the last warm-up's parts (timelines)
timings: list[tuple[str, float, float]] = []

#: the warm-up's vocabulary (its LM head GEMM differs from the real one; every other kernel matches)
WARM_VOCAB = 1024


#: ops whose torch kernels a triton-mode replay does not run (Triton kernels there), and what stands
#: in for each in a replay-only warm-up (its input passed through: the layouts downstream stay the same)
_TRITON_IN_REPLAY = {
    "RMSNormalization": lambda x, w, **_: x,
    "SkipRMSNormalization": lambda x, residual, w, **_: (x, residual),
    "RotaryEmbedding": lambda x, cos, sin, **_: x,
    "SiluMul": lambda gate, up, **_: gate,
}


def switch_interval() -> float:
    """The GIL switch interval while a pipeline starts (``SHAPEPLAN_STARTUP_SWITCH_INTERVAL`` seconds,
    default 0.0002; 0 keeps Python's own, 0.005)."""
    return max(0.0, env.get("SHAPEPLAN_STARTUP_SWITCH_INTERVAL"))


_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


def short_switch_interval() -> Callable[[], None]:
    """Shorten the GIL switch interval until the returned release is called (idempotent; nested users
    are counted, the last release restores the interval found by the first).

    While the warm-up threads and Triton's warm-up pool run Python beside the main thread, each torch
    call of the main thread releases the GIL and, once its kernel is queued, waits to take it back: up
    to the switch interval (5 ms) when another thread is running bytecode. A pipeline's construction
    makes hundreds of such calls (the KV caches, the rotary tables, the weights' views), so on the
    H200 they waited ~0.2 s in all (docs/benchmarks/decode.md round 8, sampled main thread). A 0.2 ms
    interval hands the GIL back 25x sooner; the cost is more switching while it lasts."""
    global _switch_users, _switch_saved
    s = switch_interval()
    if s <= 0:
        return lambda: None
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
        _switch_users += 1
        sys.setswitchinterval(min(s, _switch_saved))
    done = [False]

    def release() -> None:
        global _switch_users
        with _switch_lock:
            if done[0]:
                return
            done[0] = True
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)
    return release


def threads() -> int:
    """``SHAPEPLAN_CUDA_WARM_THREADS``: 1 runs the warm-up's parts one after another; any other value
    (default 4) runs each part on its own thread. Fifteenth session (H200, torch 2.11 / CUDA 13, the
    generate command's second run): one machine ran 1.8 s faster with 1, the next 0.3-0.8 s faster with 4
    (docs/benchmarks/decode.md); the default stays until more machines decide it."""
    return max(1, env.get("SHAPEPLAN_CUDA_WARM_THREADS"))


def enabled() -> bool:
    return env.get("SHAPEPLAN_CUDA_WARM")


def start(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, max_kv_cache_length: int,
          seq: int, replay_only: bool = False, head: torch.Tensor | None = None,
          block_size: int = 16) -> threading.Thread | None:
    """Start the warm-up thread (CUDA only); it runs one prefill of ``seq`` tokens. None when off.
    ``replay_only``: only the torch kernels a triton-mode replay runs (see ``layer``); ``head``: the
    model's own LM head (or tied embedding) weight, read only (see ``layer``)."""
    if device.type != "cuda" or not enabled():
        return None
    t = threading.Thread(target=_run, args=(cfg, dtype, device, max_kv_cache_length, seq, replay_only, head,
                                            block_size),
                         name="shapeplan-cuda-warm", daemon=True)
    t.start()
    return t


def _run(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, max_kv_cache_length: int, seq: int,
         replay_only: bool = False, head: torch.Tensor | None = None, block_size: int = 16) -> None:
    from shapeplan.runtime.backends.cuda_graphs import capture_lock
    try:
        with diagnostics.muted():
            cuda = device.type == "cuda"
            if cuda and device.index is not None:
                torch.cuda.set_device(device.index)
            todo = parts(cfg, dtype, device, max_kv_cache_length, seq, replay_only, head, block_size)
            timings.clear()                 # one pipeline's parts, not every warm-up of a long process
            errors: list[BaseException] = []

            def run(part: Callable[[], torch.Tensor]) -> None:
                try:
                    t0 = time.perf_counter()
                    with diagnostics.muted():
                        if cuda and device.index is not None:
                            torch.cuda.set_device(device.index)
                        part()
                        if cuda:
                            torch.cuda.current_stream(device).synchronize()
                    timings.append((part.__name__, t0, time.perf_counter()))
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)
            with capture_lock(device) if cuda else contextlib.nullcontext():
                if threads() <= 1:
                    for part in todo:
                        run(part)
                else:                   # each part's libraries and modules load beside the others'
                    ts = [threading.Thread(target=run, args=(p,), name=f"shapeplan-cuda-warm-{i}-{p.__name__}",
                                           daemon=True) for i, p in enumerate(todo)]
                    for t in ts:
                        t.start()
                    for t in ts:
                        t.join()
            if errors:
                raise errors[0]
    except Exception as e:  # noqa: BLE001 - a warm-up never breaks the pipeline
        diagnostics.record("FALLBACK", "CUDA warm-up thread failed (first calls load libraries themselves)",
                           reason=f"{type(e).__name__}: {e}"[:300])


def layer(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, kv_length: int, seq: int,
          replay_only: bool = False, head: torch.Tensor | None = None, block_size: int = 16) -> torch.Tensor:
    """One prefill step of a one-layer model on zeros through the op kernels ``model.build_graph``'s plan
    runs: every part of ``parts`` in turn. Returns the greedy token."""
    out = None
    for part in parts(cfg, dtype, device, kv_length, seq, replay_only, head, block_size):
        res = part()
        if part.__name__ == "index":
            out = res
    assert out is not None
    return out


def parts(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, kv_length: int, seq: int,
          replay_only: bool = False, head: torch.Tensor | None = None,
          block_size: int = 16) -> list[Callable[[], torch.Tensor]]:
    """The op kernels ``model.build_graph``'s paged prefill plan runs (``ops.registry.lookup(...).kernel``),
    with the same layouts (weights as transposed views, q/k/v and gate/up stacked, q/k/v split from one
    GEMM output, block-major pools of ``block_size``), on zeros, as five independent parts that may run
    on five threads: the GEMMs (cuBLAS), the attention over the blocks, the index ops (gathers, the
    last-token gather, ArgMax), the paged KV write (with k's rotation; the attention part writes too) and the
    elementwise ops.
    ``replay_only`` leaves out the ops a triton-mode replay runs as Triton kernels (the norms, RoPE of q,
    SiLU*mul): a plan frozen from a record (runtime/frozen_records.py) never runs their torch kernels,
    so loading them is wasted. ``head`` ([vocab, hidden], the model's dtype, on ``device``): the LM head
    GEMM, embedding gather and ArgMax run at the real vocabulary size (cuBLAS picks its kernel by shape;
    ArgMax takes its two-stage path from 32,768 entries), reading the weight only; without it a small
    zero head of WARM_VOCAB rows."""
    from shapeplan.ops.registry import lookup

    def k(op: str, domain: str = "shapeplan"):  # noqa: ANN202
        if replay_only and op in _TRITON_IN_REPLAY:
            return _TRITON_IN_REPLAY[op]
        return lookup(op, domain).kernel
    matmul, gather, argmax = k("MatMul", ""), k("Gather", ""), k("ArgMax", "")
    h, f = cfg.hidden_size, cfg.intermediate_size
    hq, hkv, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    use_head = isinstance(head, torch.Tensor) and head.dim() == 2 and head.shape[1] == h and head.dtype == dtype \
        and head.device.type == device.type
    v = head.shape[0] if use_head else min(cfg.vocab_size, WARM_VOCAB)
    max_blocks = -(-kv_length // block_size)

    def zeros(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dt, device=device)

    def embed() -> torch.Tensor:
        return head if use_head else zeros(v, h)

    def feeds() -> tuple[torch.Tensor, ...]:
        """input_ids, positions, lengths, block_tables (blocks 1.. in order) of one prefill row."""
        table = torch.arange(1, max_blocks + 1, dtype=torch.int32, device=device).reshape(1, -1)
        return (zeros(1, seq, dt=torch.int64), zeros(1, dt=torch.int64), zeros(1, dt=torch.int64) + seq, table)

    def pools() -> tuple[torch.Tensor, torch.Tensor]:
        return zeros(max_blocks + 1, hkv, block_size, d), zeros(max_blocks + 1, hkv, block_size, d)

    def qkv_views() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, kk, vv = zeros(1, seq, (hq + 2 * hkv) * d).split([hq * d, hkv * d, hkv * d], dim=-1)
        return (q.reshape(1, seq, hq, d).transpose(1, 2), kk.reshape(1, seq, hkv, d).transpose(1, 2),
                vv.reshape(1, seq, hkv, d).transpose(1, 2))

    def rope_tables(positions: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = k("PositionIds")(ids, positions)
        cos, sin = zeros(kv_length, d // 2), zeros(kv_length, d // 2)
        return gather(cos, pos, axis=0), gather(sin, pos, axis=0)

    def gemms() -> torch.Tensor:
        w_qkv, w_o, w_gu, w_down = zeros((hq + 2 * hkv) * d, h), zeros(h, hq * d), zeros(2 * f, h), zeros(h, f)
        matmul(zeros(1, seq, h), w_qkv.t())
        matmul(zeros(1, seq, hq * d), w_o.t())
        gate, up = matmul(zeros(1, seq, h), w_gu.t()).split([f, f], dim=-1)
        matmul(zeros(1, seq, f), w_down.t())
        nmm, mma, norm = k("RMSNormMatMul"), k("MatMulAdd"), zeros(h)
        for s in sorted({seq, 1}):         # the fused norm/projection ops: prefill rows, then the decode GEMVs
            x = nmm(zeros(1, s, h), norm, w_qkv.t(), epsilon=eps)[..., :h]
            x = mma(zeros(1, s, hq * d), w_o.t(), zeros(1, s, h), prefetch=1)      # (the model's o_proj)
            mma(nmm(x, norm, w_gu.t(), epsilon=eps, activation="silu_mul"), w_down.t(), x)
        nmm(zeros(1, 1, h), norm, embed().t(), epsilon=eps)
        return matmul(zeros(1, 1, h), embed().t()).reshape(1, -1)

    def attention() -> torch.Tensor:
        ids, positions, lengths, table = feeds()
        q, kk, vv = qkv_views()
        k_pool, v_pool = pools()
        counters = zeros(hkv, dt=torch.int32)
        a = k("PagedWriteAttention")(q, kk, vv, k_pool, v_pool, positions, lengths, table, counters,
                                     zeros(kv_length, d // 2), zeros(kv_length, d // 2),     # the rotary tables
                                     scale=float(d) ** -0.5, window=cfg.sliding_window)
        return a.transpose(1, 2).reshape(1, seq, hq * d)

    def index() -> torch.Tensor:
        ids, positions, lengths, _ = feeds()
        rope_tables(positions, ids)
        k("Embedding")(embed(), ids)
        k("LastToken")(zeros(1, seq, h), lengths)
        return argmax(zeros(1, v), axis=-1, keepdims=1)

    def cache_write() -> torch.Tensor:
        ids, positions, lengths, table = feeds()
        cos_s, sin_s = rope_tables(positions, ids)
        _, kk, vv = qkv_views()
        return k("PagedCacheWrite")(*pools(), kk, vv, positions, lengths, table, cos_s, sin_s)[0]

    def elementwise() -> torch.Tensor:
        ids, positions, _, _ = feeds()
        cos_s, sin_s = rope_tables(positions, ids)
        q, _, _ = qkv_views()
        norm, x = zeros(h), zeros(1, seq, h)
        k("RotaryEmbedding")(q, cos_s, sin_s)
        k("RMSNormalization")(x, norm, epsilon=eps)
        x2, resid = k("SkipRMSNormalization")(zeros(1, seq, h), x, norm, epsilon=eps)
        gate, up = zeros(1, seq, 2 * f).split([f, f], dim=-1)
        k("SiluMul")(gate, up)
        k("RMSNormalization")(zeros(1, 1, h), norm, epsilon=eps)
        return resid + x2

    return [gemms, attention, index, cache_write, elementwise]
