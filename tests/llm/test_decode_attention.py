"""The Triton split-K decode attention (CPU through Triton's interpreter, or the GPU): against SDPA
over the whole cache, and inside the pipeline against transformers."""
from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")          # must precede the first @triton.jit
pytest.importorskip("triton")
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton needs TRITON_INTERPRET=1 without CUDA", allow_module_level=True)

from shapeplan.ops import llm as llm_ops  # noqa: E402
from tests.llm.conftest import hf_greedy  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


@pytest.fixture
def triton_attention():
    old = llm_ops.set_decode_attention("triton")
    llm_ops._triton_failed.clear()
    yield
    assert not llm_ops._triton_failed, llm_ops._triton_failed     # the kernel ran, no silent fallback
    llm_ops.set_decode_attention(old)


@pytest.mark.parametrize("b,hq,hkv,L,d,pos,window", [
    (1, 4, 2, 96, 16, 37, 0), (1, 8, 2, 200, 64, 150, 0), (2, 6, 3, 130, 20, 5, 0),
    (1, 4, 2, 96, 16, 60, 24), (1, 4, 4, 64, 16, 63, 0), (1, 2, 1, 64, 8, 0, 0)])
def test_matches_sdpa_over_the_whole_cache(b, hq, hkv, L, d, pos, window, triton_attention):
    from shapeplan.llm.decode_attention import decode_attention
    torch.manual_seed(0)
    q = torch.randn(b, hq, 1, d, device=DEV)
    k, v = torch.randn(b, hkv, L, d, device=DEV), torch.randn(b, hkv, L, d, device=DEV)
    p = torch.tensor([pos], device=DEV)
    mask = llm_ops.causal_mask(torch.zeros(b, 1, dtype=torch.int64, device=DEV), p, kv_length=L,
                               window=window, groups=hq // hkv)
    ref = llm_ops.cached_attention(q, k, v, mask, scale=d ** -0.5)                  # SDPA (no position)
    out = decode_attention(q, k, v, p, scale=d ** -0.5, window=window)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    # the op dispatches to the kernel when given the position
    torch.testing.assert_close(llm_ops.cached_attention(q, k, v, mask, p, scale=d ** -0.5, window=window),
                               ref, atol=2e-6, rtol=1e-5)


def test_pipeline_with_triton_decode_attention_matches_transformers(checkpoints, hf_models, triton_attention):
    from shapeplan.llm import GenerationPipeline
    path = checkpoints("mistral")                                                   # GQA + sliding window
    pipe = GenerationPipeline.from_pretrained(path, mode="emulated_replay", max_prefill_length=32,
                                              max_kv_cache_length=96, progress=False, device=DEV)
    res = pipe.generate("Explain KV caching: keys and values", max_new_tokens=32)
    assert res.token_ids == hf_greedy(hf_models(path), res.prompt_token_ids, 32)


@pytest.mark.parametrize("split,warps,dot", [(32, 2, True), (128, 1, False), (16, 4, True)])
def test_tuned_variants_match_sdpa(split, warps, dot, triton_attention):
    from shapeplan.llm import decode_attention as da
    old = da.configure(split, warps, dot)
    try:
        for b, hq, hkv, L, d, pos, window in [(1, 8, 2, 200, 64, 150, 0), (1, 4, 2, 96, 16, 60, 24),
                                               (2, 6, 3, 130, 20, 5, 0)]:
            torch.manual_seed(1)
            q = torch.randn(b, hq, 1, d, device=DEV)
            k, v = torch.randn(b, hkv, L, d, device=DEV), torch.randn(b, hkv, L, d, device=DEV)
            p = torch.tensor([pos], device=DEV)
            mask = llm_ops.causal_mask(torch.zeros(b, 1, dtype=torch.int64, device=DEV), p, kv_length=L,
                                       window=window, groups=hq // hkv)
            ref = llm_ops.cached_attention(q, k, v, mask, scale=d ** -0.5)
            out = da.decode_attention(q, k, v, p, scale=d ** -0.5, window=window)
            torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    finally:
        da.configure(*old)
