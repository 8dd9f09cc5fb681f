"""Hugging Face checkpoint directory (config.json + safetensors) -> shapeplan Graph.

``sp.load(dir)`` calls ``load_hf(dir)``: the Llama-family decoder graph of shapeplan/llm/model.py
(static KV cache as variables, prefill and decode from one graph). For generation, use
``sp.llm.GenerationPipeline.from_pretrained(dir)``, which builds the same graph.
"""
from __future__ import annotations

from typing import Any

from shapeplan.ir.graph import Graph


def load_hf(path: str, *, max_kv_cache_length: int | None = None, dtype: Any = None, device: str = "cpu",
            batch: int = 1, progress: bool | None = False) -> Graph:
    import torch

    from shapeplan.llm.config import LlamaConfig
    from shapeplan.llm.model import build_graph
    from shapeplan.llm.weights import load_weights
    cfg = LlamaConfig.from_file(path)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or cfg.torch_dtype)
    weights = load_weights(path, cfg, device=device, dtype=dt, progress=progress)
    length = max_kv_cache_length or min(4096, cfg.max_position_embeddings)
    return build_graph(cfg, weights, max_kv_cache_length=length, batch=batch, dtype=dt, device=device)
