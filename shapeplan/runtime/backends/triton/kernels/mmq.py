"""Integer tensor-core GEMM over Q8_0_R / Q4_K_R / Q6_K_R weights for a few rows of x (the batched engine's
small decode buckets), after llama.cpp's MMQ. The quantized ops (shapeplan/ops/quantized.py) take it for a decode
step's 5-16 rows (Q8_0_R: 3-16) of a matrix whose one-row kernel reads x as int8 codes (``wanted``), where it
measured fastest (H100, twenty-seventh session: summed over llama-8b's seven shapes at 8 rows, Q4_K_R 686 µs
against 921 for the one-row kernels' programs per row, Q6_K_R 1,041 against 1,397, Q8_0_R 544 against 1,676; at
32 rows the fused GEMM of gguf.py ties or wins, at 64 it wins by far); never for a prefill. ``MMQ``'s ``min_m`` /
``max_m``, ``SHAPEPLAN_QUANT_MMQ_MAX_ROWS`` to move the top (0: never). ``bash bench/gpu_all.sh quant_small_m``
times it as path "mmq", ``quant_mmq_sweep`` its tilings, ``serve_quant_mmq`` end to end:

    mmq(x, packed, qtype, n, k)          x [M, K] @ W.T -> [M, N], x's dtype

x is quantized first, per row, to int8 codes per block of 32 with each block's scale and exact sum (the x
quantizer of qgemv.py, whose codes the one-row kernels' XQ = 2 reads). A program owns BM rows of x, BN rows
of W and a run of 256-element chunks; per 32-element sub-block it loads the weight's codes as int8 (Q8_0_R:
the bytes as they are; Q4_K_R: the 32 code bytes of a sub-block pair, low nibbles the first sub-block, high
nibbles the second, in element order; Q6_K_R: the ql nibbles and qh bit pairs joined, minus 32) and multiplies
them with x's codes in one int8 ``tl.dot`` (int32 sums, exact), then scales the sums: Q8_0 ``d * d_x * dot``;
Q4_K ``d * sc * d_x * dot - dmin * m * Σx`` (the one-row kernels' algebra); Q6_K ``d * sc * d_x * dot`` per
16-element sub-block, as two dots with the other half's codes zeroed (an int8 MMA's K is 32). No weight element
is converted to a float: the per-element work of the fused GEMM of gguf.py (byte loads, scale extraction, the
affine decode, a bf16 ``tl.dot``) becomes a mask and a shift of wide loads and the MMA's integer product. The
cost is x's rounding to 8 bits: about 1 % of the output's scale against dequantize-then-matmul, as with the
one-row kernels' XQ = 2 (tests: the same arithmetic in torch, and dequantize-then-matmul exactly where int8
codes hold x exactly); so unlike the per-row GEMVs its rows are not bit for bit single-stream decode's.

SWAP (default): y.T = W @ x.T, the weight tile the MMA's first operand (BN = 64 of its rows fill Hopper's
warpgroup MMA, where BM = 16 rows of x would not). Split along K as gguf.py's GEMM where the output tiles
leave SMs idle (float32 partials, summed by its ``_splitk_reduce``). K must be a multiple of 256.
"""
from __future__ import annotations

import torch

from shapeplan.quant.quantize import x_code_words
from shapeplan.runtime.backends.triton.kernels import gguf
from shapeplan.runtime.backends.triton.kernels.gguf import AVAILABLE, triton, tl

#: the types it reads -> their constexpr KIND
TYPES = {"Q8_0_R": 0, "Q4_K_R": 1, "Q6_K_R": 2}
#: the quantized ops take it for a decode step's ``min_m`` (by type) to ``max_m`` rows (``wanted``); rows of x per
#: program (None: ``block_m``'s rule), of W, warps, pipeline stages, SWAP, programs along K (None: gguf.py's rule
#: for its GEMM); ``by_type``: the keys a type sets otherwise (``tiling``). Q4_K_R's 128 rows of W and 2 stages:
#: shared by every llama-8b shape's best tilings (H100, thirtieth session, ``quant_mmq_sweep``; at 8 rows the best
#: against the committed, gate/up 115.9 -> 92.9 µs with split 4, the head 433 -> 334, o 23.7 -> 20.7), and end to
#: end llama-8b Q4_K_M at 8 requests 802 -> 877 tok/s (docs/llm.md). Q6_K_R and Q8_0_R gained 5-14 % on some
#: shapes, each from its own split along K (Q6_K_R gate/up 179.8 -> 158.2 µs with 2, Q8_0_R o 22.1 -> 19.9 with 4),
#: not from one tiling: left to a rule
MMQ = {"min_m": {"Q8_0_R": 3, "Q4_K_R": 5, "Q6_K_R": 5}, "max_m": 16, "bm": None, "bn": 64, "warps": 4, "stages": 3,
       "swap": True, "split": None, "by_type": {"Q4_K_R": {"bn": 128, "stages": 2}}}


def tiling(qtype: str) -> dict:
    """``MMQ`` with ``qtype``'s own keys (``MMQ["by_type"]``) in place."""
    return {**MMQ, **MMQ["by_type"].get(qtype, {})}


if AVAILABLE:
    from shapeplan.runtime.backends.triton.kernels.gguf import _byte, _f16, _scale_min_k4, _signed8, _store_tile

    @triton.jit
    def _outer(a_m, b_n, SWAP: tl.constexpr):
        """The [BM, BN] (SWAP: [BN, BM]) products of a vector over x's rows and one over W's rows."""
        if SWAP:
            out = b_n[:, None] * a_m[None, :]
        else:
            out = a_m[:, None] * b_n[None, :]
        return out

    @triton.jit
    def _sub(acc, wq, xrow, XD, XS, ms, m_ok, blk, SX, dw, dmw, t, MIN: tl.constexpr, SWAP: tl.constexpr):
        """``acc`` + sub-block ``blk`` (32 elements of K): x's codes [BM, 32] at ``xrow`` times the weight's
        int8 codes ``wq`` [BN, 32] in one int8 dot, scaled by x's block scale and the weight's ``dw`` [BN];
        MIN: minus the weight's minimum term ``dmw`` [BN] times x's exact block sum."""
        xq = tl.load(xrow + blk * 32 + t[None, :], mask=m_ok[:, None], other=0)            # [BM, 32] int8
        xd = tl.load(XD + ms * SX + blk, mask=m_ok, other=0.0)                             # [BM]
        if SWAP:
            dot = tl.dot(wq, tl.trans(xq), out_dtype=tl.int32)                             # [BN, BM]
        else:
            dot = tl.dot(xq, tl.trans(wq), out_dtype=tl.int32)                             # [BM, BN]
        acc += dot.to(tl.float32) * _outer(xd, dw, SWAP)
        if MIN:
            acc -= _outer(tl.load(XS + ms * SX + blk, mask=m_ok, other=0.0), dmw, SWAP)
        return acc

    @triton.jit
    def _mmq_kernel(XC, XD, XS, W, Y, M, N, K, ROW_BYTES, SX, stride_ym, PER, BM: tl.constexpr, BN: tl.constexpr,
                    KIND: tl.constexpr, PARTIAL: tl.constexpr, SWAP: tl.constexpr):
        """y = x @ W.T from x's int8 codes ``XC`` (SX int32 words a row: codes, then XD's scales and XS's sums,
        which point at row 0's) and W's packed rows (uint8, ROW_BYTES a row; KIND 0, Q8_0_R: K code bytes then
        the blocks' d; 1, Q4_K_R: 128 code bytes a chunk, then 16 header bytes a chunk, [d][dmin][scales x 12];
        2, Q6_K_R: 192 code bytes a chunk ([ql 128][qh 64]), then 16 int8 scales a chunk (one per 16 elements),
        then a chunk's d). Program (m, n, s): chunks s * PER .. (s + 1) * PER - 1 (PARTIAL: float32 sums
        [splits, M, N])."""
        pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        ms = pid_m * BM + tl.arange(0, BM)
        m_ok = ms < M
        rows = pid_n * BN + tl.arange(0, BN)
        r_ok = rows < N
        rb = W + rows.to(tl.int64) * ROW_BYTES                                             # [BN] byte pointers
        xrow = XC + ms.to(tl.int64)[:, None] * (SX * 4)                                    # [BM, 1] code bytes
        t = tl.arange(0, 32)
        chunks = K // 256
        acc = tl.zeros([BN, BM] if SWAP else [BM, BN], dtype=tl.float32)
        zero = tl.zeros([BN], dtype=tl.float32)
        for c in range(pid_s * PER, tl.minimum((pid_s + 1) * PER, chunks)):
            if KIND == 1:
                hdr = rb + chunks * 128 + c * 16                                           # [BN] chunk headers
                d, dmin = _f16(hdr, r_ok), _f16(hdr + 2, r_ok)
                for p in tl.static_range(4):                # sub-blocks 2p (low nibbles) and 2p + 1 (high)
                    b = tl.load(rb[:, None] + c * 128 + p * 32 + t[None, :], mask=r_ok[:, None], other=0)
                    for h in tl.static_range(2):
                        sc, mn = _scale_min_k4(hdr, 2 * p + h, r_ok)
                        wq = ((b >> (4 * h)) & 15).to(tl.int8)
                        acc = _sub(acc, wq, xrow, XD, XS, ms, m_ok, c * 8 + 2 * p + h, SX, d * sc.to(tl.float32),
                                   dmin * mn.to(tl.float32), t, True, SWAP)
            elif KIND == 2:                 # block j: its 32 ql nibbles and qh bit pairs, two scales (16 each)
                d = _f16(rb + chunks * 208 + c * 2, r_ok)
                for j in tl.static_range(8):
                    ql = tl.load(rb[:, None] + c * 192 + (j // 4) * 64 + (j % 2) * 32 + t[None, :],
                                 mask=r_ok[:, None], other=0)
                    qh = tl.load(rb[:, None] + c * 192 + 128 + (j // 4) * 32 + t[None, :], mask=r_ok[:, None],
                                 other=0)
                    q = (((ql >> (4 * ((j % 4) // 2))) & 15) | (((qh >> (2 * (j % 4))) & 3) << 4)).to(tl.int8)
                    q = q - 32
                    for half in tl.static_range(2):         # a dot per 16-element sub-block: the other half zeroed
                        sc = _signed8(_byte(rb + chunks * 192 + c * 16 + 2 * j + half, r_ok)).to(tl.float32)
                        wq = tl.where((t[None, :] >= 16) == (half == 1), q, 0).to(tl.int8)
                        acc = _sub(acc, wq, xrow, XD, XS, ms, m_ok, c * 8 + j, SX, d * sc, zero, t, False, SWAP)
            else:
                for j in tl.static_range(8):
                    blk = c * 8 + j
                    wq = tl.load(rb[:, None] + blk * 32 + t[None, :], mask=r_ok[:, None], other=0).to(
                        tl.int8, bitcast=True)
                    acc = _sub(acc, wq, xrow, XD, XS, ms, m_ok, blk, SX, _f16(rb + K + blk * 2, r_ok), zero, t,
                               False, SWAP)
        _store_tile(Y, acc, ms, rows, M, N, stride_ym, pid_s, PARTIAL, SWAP)


def supports(x: torch.Tensor, packed: torch.Tensor, qtype: str, k: int) -> bool:
    """Whether ``mmq`` reads this weight: a ``TYPES`` type, K a multiple of 256, x [M, K] of a float dtype."""
    return (AVAILABLE and qtype in TYPES and k % 256 == 0 and x.dim() == 2 and packed.dim() == 2
            and packed.stride(1) == 1 and x.dtype in (torch.float16, torch.bfloat16, torch.float32))


def block_m(m: int) -> int:
    """Rows of x per program for ``m`` rows: ``MMQ["bm"]``, or the power of two from 16 (tl.dot's least) to 64 that
    holds them, so up to 64 rows one program column reads each weight tile once."""
    return MMQ["bm"] or min(64, max(16, triton.next_power_of_2(m)))


def wanted(m: int, qtype: str, n: int, k: int) -> bool:
    """Whether ``m`` decode rows of x times a ``qtype`` weight of ``n`` outputs (GLU: after the gate) and ``k`` inputs run
    here: ``MMQ["min_m"][qtype]`` .. ``SHAPEPLAN_QUANT_MMQ_MAX_ROWS`` (default ``MMQ["max_m"]``) rows, and only where
    the one-row kernel reads that matrix's x as int8 codes too (``qgemv.config``'s XQ 2 / 3): then a row's codes
    are the ones its single stream multiplies and the two agree to float rounding (the order of the sums), as a
    float model's rows agree between batch sizes. Below ``min_m`` the one-row kernels' programs per row are
    faster (each row bit for bit its single-stream result)."""
    if qtype not in TYPES or m < MMQ["min_m"][qtype]:
        return False
    from shapeplan import env
    top = env.get("SHAPEPLAN_QUANT_MMQ_MAX_ROWS")
    if m > (MMQ["max_m"] if top is None else top):
        return False
    from shapeplan.runtime.backends.triton.kernels import qgemv
    return qgemv.config(qtype, n, k)[3] >= 2


def mmq(x: torch.Tensor, packed: torch.Tensor, qtype: str, n: int, k: int, *, norm_w: torch.Tensor | None = None,
        eps: float = 0.0) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype (module doc); W [n, k] packed as ``qtype`` (``TYPES``). ``norm_w``:
    rms_norm(x) * norm_w instead of x, applied where x is quantized (as the one-row kernels' XQ = 2 does)."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    if not supports(x, packed, qtype, k):
        raise ValueError(f"mmq: needs a {' / '.join(TYPES)} weight with K a multiple of 256 and float x [M, K], "
                         f"got {qtype}, K={k}, x {x.dtype} {list(x.shape)}")
    m = x.shape[0]
    x = qgemv._aligned(x)
    codes = qgemv.x_code_buffer(k, x.device, m)
    nw = None if norm_w is None else qgemv._aligned(norm_w.reshape(1, -1))
    _, xd, xs = qgemv.quantize_x(x, nw, eps, k, out=codes)
    t = tiling(qtype)
    bm, bn = block_m(m), t["bn"]
    blocks = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split, per = gguf._tile_split(k // 256, blocks, x.device, t["split"])
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = gguf._partials(y, split)
    _mmq_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), split)](
        codes.view(torch.int8), xd, xs, packed, part, m, n, k, packed.stride(0), x_code_words(k), y.stride(0), per,
        BM=bm, BN=bn, KIND=TYPES[qtype], PARTIAL=split > 1, SWAP=bool(t["swap"]), num_warps=t["warps"],
        num_stages=t["stages"])
    gguf._sum_partials(part, y, split)
    return y
