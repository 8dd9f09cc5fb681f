"""The paged KV cache on CUDA (skipped without a GPU): the Triton paged write and split-K decode
attention against the torch reference kernels (the batched engine on CUDA: tests/llm/test_gpu.py)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _case(dtype, b=5, hq=8, hkv=2, d=64, bs=16, nb=64, maxb=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    kp = torch.randn(nb, hkv, bs, d, generator=g).to("cuda", dtype)
    vp = torch.randn(nb, hkv, bs, d, generator=g).to("cuda", dtype)
    perm = torch.randperm(nb - 1, generator=g) + 1
    bt = perm[:b * maxb].reshape(b, maxb).to(torch.int32).cuda()
    return kp, vp, bt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 37])
def test_triton_decode_attention_matches_the_torch_kernel(dtype, window):
    from shapeplan.ops import llm
    from shapeplan.runtime.backends.triton.kernels import paged
    kp, vp, bt = _case(dtype)
    q = torch.randn(5, 8, 1, 64, device="cuda").to(dtype)
    positions = torch.tensor([0, 15, 16, 100, 180], device="cuda")
    lengths = torch.tensor([1, 1, 1, 0, 1], device="cuda")              # row 3 is padding
    got = paged.paged_decode_attention(q, kp, vp, positions, lengths, bt, scale=0.125, window=window)
    want = llm.paged_attention(q.cpu(), kp.cpu(), vp.cpu(), positions.cpu(), lengths.cpu(), bt.cpu(), scale=0.125,
                               window=window)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)
    assert got[3].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_paged_write_matches_the_torch_kernel(dtype):
    from shapeplan.ops import llm
    from shapeplan.runtime.backends.triton.kernels import paged
    kp, vp, bt = _case(dtype)
    k = torch.randn(5, 2, 7, 64, device="cuda").to(dtype)
    v = torch.randn(5, 2, 7, 64, device="cuda").to(dtype)
    cos, sin = torch.randn(5, 7, 32, device="cuda").to(dtype), torch.randn(5, 7, 32, device="cuda").to(dtype)
    positions = torch.tensor([0, 9, 30, 3, 60], device="cuda")
    lengths = torch.tensor([7, 3, 0, 1, 7], device="cuda")
    k2, v2 = kp.clone(), vp.clone()
    paged.paged_cache_write(kp, vp, k, v, positions, lengths, bt, cos, sin)
    llm._paged_kernel_state[:] = [None]                                   # the torch kernel, on the GPU
    try:
        llm.paged_cache_write(k2, v2, k, v, positions, lengths, bt, cos, sin)
    finally:
        llm._paged_kernel_state.clear()
    kp[0], k2[0], vp[0], v2[0] = 0, 0, 0, 0                               # the null block takes padding
    assert torch.equal(kp, k2) and torch.equal(vp, v2)
