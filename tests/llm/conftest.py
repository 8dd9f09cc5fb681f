"""Fixtures: tiny random Llama / Mistral / Qwen2 / Qwen3 / Phi-3 checkpoints written once per test session with
transformers' save_pretrained, plus a BPE tokenizer trained with `tokenizers` (nothing downloads)."""
from __future__ import annotations

import contextlib

import pytest
import torch

MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3", "phi3"]

# each fixture exercises a different switch of the family
_OVERRIDES = {
    "llama": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}),
    "mistral": dict(sliding_window=24, shard=True),   # sliding window + a sharded index
    "qwen2": dict(),                                   # qkv bias, tied embeddings
    "qwen3": dict(),                                   # q/k norm, tied embeddings
    "phi3": dict(sliding_window=24, shard=True),       # fused qkv / gate_up tensors, split across shards
}


#: a test run twice: with the CPU's default (no round launched ahead) and with every round launched ahead
AHEAD = pytest.mark.parametrize("ahead", ["auto", True], ids=["cpu_default", "launched_ahead"])


@contextlib.contextmanager
def launched_ahead(pipe, ahead):
    """``pipe.batch.launch_ahead = ahead`` inside the block. With True (what ``auto`` does on a GPU, here on
    the CPU) the block must launch at least one decode round ahead of its read-back, so a test of that path
    cannot pass without taking it."""
    old, rounds = pipe.batch.launch_ahead, pipe.batch.async_rounds
    pipe.batch.launch_ahead = ahead
    try:
        yield
    finally:
        pipe.batch.launch_ahead = old
    if ahead is True:
        assert pipe.batch.async_rounds > rounds, "no decode round was launched ahead"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs with one intra-op thread (the shared ``one_thread`` fixture)."""


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """model_type -> checkpoint directory (built lazily, once)."""
    from shapeplan.llm.demo import make_tiny_checkpoint
    made: dict[str, str] = {}

    def get(model_type: str) -> str:
        if model_type not in made:
            d = tmp_path_factory.mktemp(f"ckpt-{model_type}")
            made[model_type] = make_tiny_checkpoint(str(d), model_type, **_OVERRIDES[model_type])
        return made[model_type]

    return get


@pytest.fixture(scope="session")
def hf_models():
    """model_type -> transformers model (float32, eval) loaded from the same checkpoint."""
    cache: dict[str, object] = {}

    def get(path: str):
        if path not in cache:
            from transformers import AutoModelForCausalLM
            cache[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        return cache[path]

    return get


def hf_greedy(model, ids: list[int], n: int, **kw) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, **kw)
    return out[0, len(ids):].tolist()


def prefill_logits(pipe, ids: list[int]) -> torch.Tensor:
    """The pipeline's logits at every prompt position [n, V] (one prefill call from position 0)."""
    return pipe.score(ids)
