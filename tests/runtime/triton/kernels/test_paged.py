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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("window", [0, 20])
@pytest.mark.parametrize("programs", [paged.TARGET_PROGRAMS, 6, 12])  # 6: all four blocks in one split; 12: two
@pytest.mark.parametrize("chunk", [None, 2])                   # 2: the merge over the live splits in chunks
@pytest.mark.parametrize("form", ["early", "strided", "late"])
def test_the_decode_kernel_writes_as_the_write_kernel_and_attends_as_the_torch_ops(dtype, interleaved, window,
                                                                                   programs, chunk, form, monkeypatch):
    """PagedWriteAttention's decode kernel (write of k rotated and v, split-K attention, merge in the last
    program; the rotary tables read at each row's position): pools bit-equal to the write kernel's,
    output as PagedWriteAttention's torch path (PagedCacheWrite + PagedAttention); the counters are
    left zero, so a second step (next position, one more key) is right too. Each form of the kernel gives
    the late form's output and pools: EARLY (the new token patched in from registers) bit for bit, STRIDED
    (the same partials merged in another order) within one bf16 ulp."""
    monkeypatch.setattr(paged, "TARGET_PROGRAMS", programs)
    monkeypatch.setattr(paged, "MERGE_CHUNK", chunk)
    monkeypatch.setattr(paged, "EARLY", form != "late")
    monkeypatch.setattr(paged, "STRIDED", form == "strided")
    b, hq, hkv, d = 3, 4, 2, 16
    q, kp, vp, bt, _, _ = _case(dtype, b=b, hq=hq, hkv=hkv, d=d)
    g = torch.Generator().manual_seed(9)
    ang = torch.rand(64, d // 2, generator=g) * 6.0                   # the rotary tables [L, D/2]
    cos, sin = ang.cos().to(DEV, dtype), ang.sin().to(DEV, dtype)
    lengths = torch.tensor([1, 0, 1], device=DEV)                     # row 1 is padding
    counters = torch.zeros(b * hkv + 5, dtype=torch.int32, device=DEV)
    ref_k, ref_v, kern_k, kern_v = kp.cpu().clone(), vp.cpu().clone(), kp.clone(), vp.clone()
    for step, positions in enumerate(([0, 17, 40], [1, 18, 41])):
        positions = torch.tensor(positions, device=DEV)
        qkv = torch.randn(b, 1, (hq + 2 * hkv) * d, generator=g).to(DEV, dtype)   # q, k, v: views as in the graph
        q = qkv[..., :hq * d].reshape(b, 1, hq, d).transpose(1, 2)
        k = qkv[..., hq * d:(hq + hkv) * d].reshape(b, 1, hkv, d).transpose(1, 2)
        v = qkv[..., (hq + hkv) * d:].reshape(b, 1, hkv, d).transpose(1, 2)
        kw = dict(scale=0.25, window=window, cos=cos, sin=sin, interleaved=interleaved, k=k, v=v, counters=counters,
                  rope_table=True)
        other_k, other_v = kern_k.clone(), kern_v.clone()
        got = paged.paged_decode_attention(q, kern_k, kern_v, positions, lengths, bt, **kw)
        monkeypatch.setattr(paged, "EARLY", form == "late")           # another form, from the same pools
        if form == "strided":                                         # (the same splits merged in another order)
            close = 1e-6 if dtype == torch.float32 else 2 ** -7
            torch.testing.assert_close(paged.paged_decode_attention(q, other_k, other_v, positions, lengths, bt,
                                                                    **kw), got, rtol=close, atol=close)
        else:
            assert torch.equal(paged.paged_decode_attention(q, other_k, other_v, positions, lengths, bt, **kw), got)
        assert torch.equal(other_k, kern_k) and torch.equal(other_v, kern_v)
        monkeypatch.setattr(paged, "EARLY", form != "late")
        want = llm_ops.paged_write_attention(q.cpu(), k.cpu(), v.cpu(), ref_k, ref_v, positions.cpu(), lengths.cpu(),
                                             bt.cpu(), None, cos.cpu(), sin.cpu(), scale=0.25, window=window,
                                             interleaved=interleaved)
        wk, wv = kp.clone(), vp.clone()
        paged.paged_cache_write(wk, wv, k, v, positions, lengths, bt, cos[positions].unsqueeze(1),
                                sin[positions].unsqueeze(1), interleaved=interleaved)
        if step == 0:                       # the write kernel from the same pools: bit-equal pools
            assert torch.equal(kern_k, wk) and torch.equal(kern_v, wv)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        # against the torch kernels (which send the padding row's write to the null block 0, where the
        # Triton kernels write nothing): k within two ulps of bf16 (the interpreter rounds the products apart)
        torch.testing.assert_close(kern_k[1:].cpu(), ref_k[1:], rtol=2 ** -5 if dtype == torch.bfloat16 else 0,
                                   atol=tol if dtype == torch.bfloat16 else 1e-6)
        torch.testing.assert_close(kern_v[1:].cpu(), ref_v[1:], rtol=0, atol=0)
        torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)
        assert got[1].abs().max() == 0 and not counters.any()


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 32), (6, 2, 64), (4, 4, 96)])    # G 2, 3 (GP 4), 1; D 96: DP 128
@pytest.mark.parametrize("row0", ["live", "padding"])
def test_the_decode_kernel_writes_row_0_as_x_codes(hq, hkv, d, row0):
    """``x_codes``: the merges of row 0 also write its output, flattened (the o projection's x), as int8 codes
    per block of 32: the same words and scales as qgemv's x quantizer and the torch form give for that
    output, sums to float32 rounding; the output itself unchanged. A padding row 0 gives zeros."""
    from shapeplan.quant.quantize import x_codes
    from shapeplan.runtime.backends.triton.kernels import qgemv
    from tests.ops.test_quant_ops import assert_same_x_codes
    b = 3
    q, kp, vp, bt, _, _ = _case(torch.bfloat16, b=b, hq=hq, hkv=hkv, d=d)
    positions = torch.tensor([21, 17, 40], device=DEV)
    lengths = torch.tensor([1 if row0 == "live" else 0, 1, 1], device=DEV)
    plain = paged.paged_decode_attention(q, kp, vp, positions, lengths, bt, scale=0.25)
    got, codes = paged.paged_decode_attention(q, kp, vp, positions, lengths, bt, scale=0.25, x_codes=True)
    assert torch.equal(got, plain)
    x = got[0, :, 0, :].reshape(1, -1)                                            # [1, Hq * D]
    k = hq * d
    assert codes.dtype == torch.int32 and codes.shape == (qgemv.x_code_words(k),)
    mine = torch.empty_like(codes)
    qgemv.quantize_x(x, None, 0.0, k, out=mine)                   # the x quantizer: the same Triton arithmetic
    assert_same_x_codes(codes, mine, k)
    assert_same_x_codes(codes, x_codes(x.cpu()), k, ties=CUDA)    # the torch form
    if row0 == "padding":
        assert not codes.any()
    else:
        assert codes[:k // 4].any()
    with pytest.raises(ValueError, match="multiple of 32"):
        paged.paged_decode_attention(*_case(torch.bfloat16, hq=2, hkv=2, d=16)[:3], positions, lengths, bt,
                                     scale=0.25, x_codes=True)


def test_too_few_counters_is_a_clear_error():
    q, kp, vp, bt, _, _ = _case(torch.float32)
    with pytest.raises(ValueError, match="counters must be int32 with at least B \\* Hkv = 6"):
        paged.paged_decode_attention(q, kp, vp, torch.zeros(3, dtype=torch.int64, device=DEV),
                                     torch.ones(3, dtype=torch.int64, device=DEV), bt, scale=0.25,
                                     counters=torch.zeros(4, dtype=torch.int32, device=DEV))


def test_the_decode_kernel_compiles_for_sm90():
    """As the H200 compiles it (Triton's ptxas, no GPU needed; the interpreter checks no types): with and
    without the write, at head dims 64 and 128 (their tilings differ), and with programmatic dependent launch
    (griddepcontrol in the PTX)."""
    from tests.ops.test_quant_ops import _compile_sm90
    res = _compile_sm90("paged:write:0", "paged:write:1", "paged:read:0", "paged:write128:0",   # head dims 64, 128
                        "paged:writeq128:0", "paged:writeq:1",                             # + x as int8 codes
                        "paged:write:2", "paged:write:3", "paged:read:2", "paged:write128:3",  # the EARLY form
                        "paged:writeq:3", "paged:write:7", "paged:write128:7", "paged:writeq:7")   # + STRIDED
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items()}
    assert res["paged:write:1"]["griddepcontrol"] and not res["paged:write:0"]["griddepcontrol"]
