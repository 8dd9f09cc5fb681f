"""Start-up: load the CUDA libraries and kernels a model's first call uses while the pipeline is built.

A fresh process pays on the first use of each CUDA library and kernel: cuBLAS's initialisation, the
attention kernels, each elementwise kernel's module (CUDA loads modules lazily). On the H200 that is
0.3-0.4 s of the llama-1b pipeline's first (slot-by-slot) prefill call, against ~0.03 s for the same
call once they are loaded (``bench/gpu_slot_times.py``). So, on CUDA, the pipeline starts a thread that
calls the model's own op kernels (the registered ones the plan will run) once, in the order of one
decoder layer, on zero tensors with the model's hidden and MLP sizes, heads, dtype and KV length:
the same kernels, loaded while the main thread builds and optimizes the graph. The thread does almost
no Python work (a first version ran a one-layer copy of the model through the engine; its graph build
competed with the main thread's for the GIL and gained nothing); torch releases the GIL inside its
kernels, so the loading overlaps construction.

The pipeline joins the thread before its first request runs: torch keeps one cuBLAS handle per thread
and a 32 MiB workspace per handle, and a handle released by a finished thread is the one the next
thread takes, so the request's thread reuses it instead of allocating a second workspace (measured:
+33.6 MB of memory beyond weights when the two overlapped). The thread holds the device's capture lock while it launches, so no CUDA graph capture in the process
runs beside it (a capture waits for it). It warms the prefill only: a decode step would wait for the
decode-attention kernels, which a cold start is still compiling. Best effort: a failure is recorded
and changes nothing else. Memory: one layer's weights, freed when it ends. ``SHAPEPLAN_CUDA_WARM=0``
turns it off.
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch

from shapeplan import diagnostics
from shapeplan.llm.config import LlamaConfig

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


def enabled() -> bool:
    return os.environ.get("SHAPEPLAN_CUDA_WARM", "1").strip().lower() not in ("0", "false", "off", "no")


def start(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, max_kv_cache_length: int,
          seq: int, replay_only: bool = False, head: torch.Tensor | None = None) -> threading.Thread | None:
    """Start the warm-up thread (CUDA only); it runs one prefill of ``seq`` tokens. None when off.
    ``replay_only``: only the torch kernels a triton-mode replay runs (see ``layer``); ``head``: the
    model's own LM head (or tied embedding) weight, read only (see ``layer``)."""
    if device.type != "cuda" or not enabled():
        return None
    t = threading.Thread(target=_run, args=(cfg, dtype, device, max_kv_cache_length, seq, replay_only, head),
                         name="shapeplan-cuda-warm", daemon=True)
    t.start()
    return t


def _run(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, max_kv_cache_length: int, seq: int,
         replay_only: bool = False, head: torch.Tensor | None = None) -> None:
    from shapeplan.runtime.backends.cuda_graphs import capture_lock
    try:
        with diagnostics.muted():
            cuda = device.type == "cuda"
            if cuda and device.index is not None:
                torch.cuda.set_device(device.index)
            with capture_lock(device) if cuda else contextlib.nullcontext():
                layer(cfg, dtype, device, max_kv_cache_length, seq, replay_only, head)
                if cuda:
                    torch.cuda.current_stream(device).synchronize()
    except Exception as e:  # noqa: BLE001 - a warm-up never breaks the pipeline
        diagnostics.record("FALLBACK", "CUDA warm-up thread failed (first calls load libraries themselves)",
                           reason=f"{type(e).__name__}: {e}"[:300])


def layer(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, kv_length: int, seq: int,
          replay_only: bool = False, head: torch.Tensor | None = None) -> torch.Tensor:
    """One prefill step of a one-layer model on zeros, through the op kernels ``model.build_graph``'s
    plan runs (``ops.registry.lookup(...).kernel``), with the same layouts (weights as transposed views,
    q/k/v and gate/up stacked). Returns the greedy token. ``replay_only`` leaves out the ops a
    triton-mode replay runs as Triton kernels (the norms, RoPE of q, SiLU*mul): a plan frozen from a
    record (runtime/frozen_records.py) never runs their torch kernels, so loading them is wasted.
    ``head`` ([vocab, hidden], the model's dtype, on ``device``): the LM head GEMM and the ArgMax run at
    the real vocabulary size (cuBLAS picks its kernel by shape; ArgMax takes its two-stage path from
    32,768 entries), reading the weight only; without it a small zero head of WARM_VOCAB rows."""
    from shapeplan.ops.registry import lookup

    def k(op: str, domain: str = "shapeplan"):  # noqa: ANN202
        if replay_only and op in _TRITON_IN_REPLAY:
            return _TRITON_IN_REPLAY[op]
        return lookup(op, domain).kernel
    matmul, gather, argmax = k("MatMul", ""), k("Gather", ""), k("ArgMax", "")
    h, f, v = cfg.hidden_size, cfg.intermediate_size, min(cfg.vocab_size, WARM_VOCAB)
    hq, hkv, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps

    def zeros(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dt, device=device)
    ids, position, length = zeros(1, seq, dt=torch.int64), zeros(1, dt=torch.int64), zeros(1, dt=torch.int64) + seq
    use_head = head is not None and head.dim() == 2 and head.shape[1] == h and head.dtype == dtype \
        and head.device.type == device.type
    embed, norm = (head if use_head else zeros(v, h)), zeros(h)
    w_qkv, w_o, w_gu, w_down = zeros((hq + 2 * hkv) * d, h), zeros(h, hq * d), zeros(2 * f, h), zeros(h, f)
    k_cache, v_cache = zeros(1, hkv, kv_length, d), zeros(1, hkv, kv_length, d)
    cos, sin = zeros(kv_length, d // 2), zeros(kv_length, d // 2)

    pos = k("PositionIds")(ids, position)
    cos_s, sin_s = gather(cos, pos, axis=0), gather(sin, pos, axis=0)
    mask = k("CausalMask")(ids, position, kv_length=kv_length, window=cfg.sliding_window, groups=hq // hkv,
                           dtype=str(dtype).replace("torch.", ""))
    resid = gather(embed, ids, axis=0)
    x = k("RMSNormalization")(resid, norm, epsilon=eps)
    q, kk, vv = matmul(x, w_qkv.t()).split([hq * d, hkv * d, hkv * d], dim=-1)
    q = q.reshape(1, seq, hq, d).transpose(1, 2)
    kk, vv = kk.reshape(1, seq, hkv, d).transpose(1, 2), vv.reshape(1, seq, hkv, d).transpose(1, 2)
    rope = k("RotaryEmbedding")
    q = rope(q, cos_s, sin_s)
    k_all, v_all = k("CacheWriteKV")(k_cache, v_cache, kk, vv, position, cos_s, sin_s, axis=2)
    a = k("CachedAttention")(q, k_all, v_all, mask, position, scale=float(d) ** -0.5, window=cfg.sliding_window)
    a = a.transpose(1, 2).reshape(1, seq, hq * d)
    x, resid = k("SkipRMSNormalization")(matmul(a, w_o.t()), resid, norm, epsilon=eps)
    gate, up = matmul(x, w_gu.t()).split([f, f], dim=-1)
    resid = resid + matmul(k("SiluMul")(gate, up), w_down.t())
    last = gather(resid, length - 1, axis=1)
    logits = matmul(k("RMSNormalization")(last, norm, epsilon=eps), embed.t()).reshape(1, -1)
    return argmax(logits, axis=-1, keepdims=1)
