"""Start-up: load the CUDA libraries a model's first call uses while the pipeline is being built.

A fresh process pays on the first use of each CUDA library and kernel: cuBLAS's initialisation, the
attention kernels, each elementwise kernel's module (CUDA loads modules lazily). On the H200 that is
0.3-0.4 s of the llama-1b pipeline's first (slot-by-slot) prefill call, against ~0.03 s for the same
call once they are loaded (``bench/gpu_slot_times.py``). So, on CUDA, the pipeline runs a one-layer copy
of its model (zero weights, a small vocabulary; the same hidden and MLP sizes, heads, dtype and KV
length, so the same kernels) slot by slot on a background thread while it builds and optimizes the
real graph: torch releases the GIL inside its kernels, so the two overlap.

The thread holds the device's capture lock while it launches, so no CUDA graph capture in the process
runs beside it (a capture waits for it), and it records no diagnostics events (its plans are not the
user's). It warms the prefill only: a decode step would wait for the decode-attention kernels, which a
cold start is still compiling. Best effort: a failure is recorded and changes nothing else.
``SHAPEPLAN_CUDA_WARM=0`` turns it off.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading

import torch

from shapeplan import diagnostics
from shapeplan.llm.config import LlamaConfig

#: the warm-up copy's vocabulary (the LM head's GEMM differs from the real one's; everything else matches)
WARM_VOCAB = 1024


def enabled() -> bool:
    return os.environ.get("SHAPEPLAN_CUDA_WARM", "1").strip().lower() not in ("0", "false", "off", "no")


def start(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, max_kv_cache_length: int,
          seq: int) -> threading.Thread | None:
    """Start the warm-up thread (CUDA only); it runs one prefill of ``seq`` tokens. None when off."""
    if device.type != "cuda" or not enabled():
        return None
    t = threading.Thread(target=_run, args=(cfg, dtype, device, max_kv_cache_length, seq),
                         name="shapeplan-cuda-warm", daemon=True)
    t.start()
    return t


def small_config(cfg: LlamaConfig) -> LlamaConfig:
    return dataclasses.replace(cfg, num_layers=1, vocab_size=min(cfg.vocab_size, WARM_VOCAB))


def _run(cfg: LlamaConfig, dtype: torch.dtype, device: torch.device, max_kv_cache_length: int, seq: int) -> None:
    import shapeplan as sp
    from shapeplan.llm.model import build_graph
    from shapeplan.llm.weights import expected_shapes
    from shapeplan.runtime.backends.cuda_graphs import capture_lock
    try:
        with diagnostics.muted():
            if device.type == "cuda" and device.index is not None:
                torch.cuda.set_device(device.index)
            small = small_config(cfg)
            weights = {name: torch.zeros(shape, device=device, dtype=dtype)
                       for name, shape in expected_shapes(small).items()}
            graph = build_graph(small, weights, max_kv_cache_length=max_kv_cache_length, dtype=dtype, device=device)
            engine = sp.compile(graph, device=str(device), mode="slot_by_slot", optimize=True)
            feeds = {"input_ids": torch.zeros(1, seq, dtype=torch.int64, device=device),
                     "position": torch.zeros(1, dtype=torch.int64, device=device),
                     "length": torch.full((1,), seq, dtype=torch.int64, device=device)}
            cuda = device.type == "cuda"
            with capture_lock(device) if cuda else contextlib.nullcontext():
                engine.run(feeds, outputs=["next_token", "next_position"])
                if cuda:
                    torch.cuda.current_stream(device).synchronize()
            engine.close()
    except Exception as e:  # noqa: BLE001 - a warm-up never breaks the pipeline
        diagnostics.record("FALLBACK", "CUDA warm-up thread failed (first calls load libraries themselves)",
                           reason=f"{type(e).__name__}: {e}"[:300])
