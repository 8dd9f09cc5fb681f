"""The Triton split-K decode attention inside the pipeline (CPU through Triton's interpreter, or the
GPU) against transformers; the kernel alone: tests/runtime/triton/kernels/test_decode_attention.py."""
from __future__ import annotations

from tests.triton_setup import CUDA  # noqa: E402 - before anything imports Triton

from tests.llm.conftest import hf_greedy  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def test_pipeline_with_triton_decode_attention_matches_transformers(checkpoints, hf_models, triton_attention):
    from shapeplan.llm import GenerationPipeline
    path = checkpoints("mistral")                                                   # GQA + sliding window
    pipe = GenerationPipeline.from_pretrained(path, mode="emulated_replay", max_prefill_length=32,
                                              max_kv_cache_length=96, progress=False, device=DEV)
    res = pipe.generate("Explain KV caching: keys and values", max_new_tokens=32)
    assert res.token_ids == hf_greedy(hf_models(path), res.prompt_token_ids, 32)
