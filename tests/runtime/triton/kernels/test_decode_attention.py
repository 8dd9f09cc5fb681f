"""The Triton split-K decode attention kernel (CPU through Triton's interpreter, or the GPU) against SDPA
over the whole cache, in its default and tuned variants (tests/llm/test_decode_attention.py runs it
inside the pipeline against transformers)."""
from __future__ import annotations

import pytest
import torch

from tests.triton_setup import CUDA  # noqa: E402 - before anything imports Triton

from shapeplan.ops import llm as llm_ops  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _case(b, hq, hkv, L, d, pos, window, seed):
    """Random q [B, Hq, 1, D] and caches [B, Hkv, L, D], the position, the causal mask, and SDPA's answer
    over the whole cache (the op without a position)."""
    torch.manual_seed(seed)
    q = torch.randn(b, hq, 1, d, device=DEV)
    k, v = torch.randn(b, hkv, L, d, device=DEV), torch.randn(b, hkv, L, d, device=DEV)
    p = torch.tensor([pos], device=DEV)
    mask = llm_ops.causal_mask(torch.zeros(b, 1, dtype=torch.int64, device=DEV), p, kv_length=L,
                               window=window, groups=hq // hkv)
    return q, k, v, p, mask, llm_ops.cached_attention(q, k, v, mask, scale=d ** -0.5)


@pytest.mark.parametrize("b,hq,hkv,L,d,pos,window", [
    (1, 4, 2, 96, 16, 37, 0), (1, 8, 2, 200, 64, 150, 0), (2, 6, 3, 130, 20, 5, 0),
    (1, 4, 2, 96, 16, 60, 24), (1, 4, 4, 64, 16, 63, 0), (1, 2, 1, 64, 8, 0, 0)])
def test_matches_sdpa_over_the_whole_cache(b, hq, hkv, L, d, pos, window, triton_attention):
    from shapeplan.runtime.backends.triton.kernels.decode_attention import decode_attention
    q, k, v, p, mask, ref = _case(b, hq, hkv, L, d, pos, window, seed=0)
    out = decode_attention(q, k, v, p, scale=d ** -0.5, window=window)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    # the op dispatches to the kernel when given the position
    torch.testing.assert_close(llm_ops.cached_attention(q, k, v, mask, p, scale=d ** -0.5, window=window),
                               ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("split,warps,dot", [(32, 2, True), (128, 1, False), (16, 4, True)])
def test_tuned_variants_match_sdpa(split, warps, dot, triton_attention):
    from shapeplan.runtime.backends.triton.kernels import decode_attention as da
    old = da.configure(split, warps, dot)
    try:
        for b, hq, hkv, L, d, pos, window in [(1, 8, 2, 200, 64, 150, 0), (1, 4, 2, 96, 16, 60, 24),
                                               (2, 6, 3, 130, 20, 5, 0)]:
            q, k, v, p, _, ref = _case(b, hq, hkv, L, d, pos, window, seed=1)
            out = da.decode_attention(q, k, v, p, scale=d ** -0.5, window=window)
            torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    finally:
        da.configure(*old)
