"""The paged split-K decode attention (CPU through Triton's interpreter, or the GPU) against the op's torch
kernel, with q rotated inside the kernel (RoPE of the LLM graph's decode step) and without."""
from __future__ import annotations

import pytest
import torch

from tests.triton_setup import CUDA  # noqa: E402 - before anything imports Triton

from shapeplan.ops import llm as llm_ops  # noqa: E402
from shapeplan.ops.transformer import rotary_embedding  # noqa: E402
from shapeplan.runtime.backends.triton.kernels import paged  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _case(dtype, b=3, hq=4, hkv=2, d=16, bs=16, nb=16, maxb=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    kp = torch.randn(nb, hkv, bs, d, generator=g).to(DEV, dtype)
    vp = torch.randn(nb, hkv, bs, d, generator=g).to(DEV, dtype)
    bt = (torch.randperm(nb - 1, generator=g)[:b * maxb] + 1).reshape(b, maxb).to(torch.int32).to(DEV)
    # q as the graph passes it: a [B, Hq, 1, D] view of a q/k/v projection row [B, 1, (Hq + 2 Hkv) D]
    qkv = torch.randn(b, 1, (hq + 2 * hkv) * d, generator=g).to(DEV, dtype)
    q = qkv[..., :hq * d].reshape(b, 1, hq, d).transpose(1, 2)
    ang = torch.rand(b, 1, d // 2, generator=g) * 6.0
    return q, kp, vp, bt, ang.cos().to(DEV, dtype), ang.sin().to(DEV, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotate", [False, True])
def test_paged_decode_attention_equals_the_torch_kernel(dtype, interleaved, rotate):
    q, kp, vp, bt, cos, sin = _case(dtype)
    positions = torch.tensor([0, 17, 40], device=DEV)
    lengths = torch.tensor([1, 0, 1], device=DEV)                     # row 1 is padding
    kw = dict(cos=cos, sin=sin, interleaved=interleaved) if rotate else {}
    got = paged.paged_decode_attention(q, kp, vp, positions, lengths, bt, scale=0.25, **kw)
    qr = rotary_embedding(q.cpu(), cos.cpu(), sin.cpu(), interleaved=interleaved) if rotate else q.cpu()
    want = llm_ops.paged_attention(qr, kp.cpu(), vp.cpu(), positions.cpu(), lengths.cpu(), bt.cpu(), scale=0.25)
    # the op's own path with cos/sin (it rotates q first) agrees with rotating outside
    if rotate:
        torch.testing.assert_close(llm_ops.paged_attention(q.cpu(), kp.cpu(), vp.cpu(), positions.cpu(),
                                                           lengths.cpu(), bt.cpu(), cos.cpu(), sin.cpu(), scale=0.25,
                                                           interleaved=interleaved), want, rtol=0, atol=0)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)
    assert got[1].abs().max() == 0


@pytest.mark.parametrize("interleaved", [0, 1])
def test_prefill_rotation_of_a_qkv_view_equals_rotary_embedding(interleaved):
    """PagedAttention's prefill on CUDA rotates q with the RoPE row kernel as ``_rotate`` calls it: q a
    [B, Hq, S, D] view of the q/k/v projection, cos/sin [B, S, D/2] broadcast over the heads."""
    from shapeplan.runtime.backends.triton.kernels import rows
    g = torch.Generator().manual_seed(5)
    b, s, hq, hkv, d = 2, 5, 4, 2, 16
    qkv = torch.randn(b, s, (hq + 2 * hkv) * d, generator=g).to(DEV)
    q = qkv[..., :hq * d].reshape(b, s, hq, d).transpose(1, 2)
    ang = torch.rand(b, s, d // 2, generator=g) * 6.0
    cos, sin = ang.cos().to(DEV), ang.sin().to(DEV)
    got = rows.rope(q, cos.unsqueeze(1), sin.unsqueeze(1), bool(interleaved))
    want = rotary_embedding(q.cpu(), cos.cpu(), sin.cpu(), interleaved=interleaved)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
