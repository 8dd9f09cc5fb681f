"""Triton kernels over packed GGUF / shapeplan block weights: dequantizing GEMV (decode, M <= 8; up to 8 rows
of Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / IQ4 run the faster one-row kernel of qgemv.py instead, see there),
dequantizing GEMM (prefill: weight tiles dequantized into ``tl.dot``), and row dequantization (the
quantized embedding lookup, and the dequantize-to-scratch + cuBLAS prefill path).

The weight is the file's own layout (shapeplan/quant/formats.py): ``packed`` uint8 [N, R], R bytes
per row. A kernel walks a row in chunks of 256 elements; one decoder per block family turns the bytes
of a chunk of BN rows into a float32 tile ``[BN, NSUB, SUBLEN]`` (the chunk as sub-blocks of one scale
each), reading each byte of the weight from memory once (a byte two elements share is loaded twice
from L1, not from DRAM). The activation chunk is read in natural order, so no reordering of x or of
the weight is needed.

GEMV: grid (cdiv(N, BN), SPLIT). Each program holds BN rows and a run of chunks, decodes each chunk
once and multiplies it with every one of the M <= 8 activation rows (so batched decode reads the weight
once, not M times). SPLIT > 1 (few rows, e.g. a K/V projection) writes float32 partials that
``_splitk_reduce`` sums and casts; the GEMM splits along K the same way where its output tiles leave
SMs idle (``gemm``). Everything is launched from the op kernel with device tensors only, so a decode step
with these kernels captures into a CUDA graph.

Importing this module never fails: without Triton, ``AVAILABLE`` is False and the op kernels use the
torch reference (shapeplan/quant/dequant.py).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

try:
    import triton
    import triton.language as tl
    AVAILABLE = True
except ImportError:                       # the op module imports us; CPU installs may lack Triton
    triton = tl = None
    AVAILABLE = False

CHUNK = 256
#: kernel family -> decoder id (constexpr KIND)
KINDS = {"int8": 0, "int4": 1, "q4_0": 2, "q5_0": 3, "q5_1": 4, "iq4_nl": 5,
         "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_xs": 15, "q4_k_r": 16, "q8_0_r": 17, "q6_k_r": 18}

#: decode GEMV tuning: rows per program, warps, chunks decoded per loop iteration (their loads are in
#: flight together), and the programs below which split-K is used (0: the device's SM count)
GEMV = {"bn": 8, "warps": 4, "unroll": 2, "min_programs": 0}
#: up to ``qgemv.MAX_ROWS`` (8) activation rows of Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / IQ4 run the one-row kernel of
#: qgemv.py (its tuning is there), a program per row; False: the generic GEMV above (bench/quant_gemv.py compares
#: them: at 2-8 rows it was 3-5x slower than one call per row of the one-row kernel, H100, twenty-fifth session)
GEMV1 = True
#: prefill (9+ rows) GEMM tuning and path. ``path``: "fused" (dequantize tiles into tl.dot), "dequant" (dequantize
#: the weight to a scratch buffer in the activation dtype, then cuBLAS), "auto": the fused GEMM up to
#: ``fused_max_m`` rows on matrices of at least ``fused_min_weights`` elements (N * K), dequant + cuBLAS elsewhere.
#: The fused GEMM's tiling: ``bm`` rows per program (None: 16 up to 16 rows, else 64), ``bn`` outputs, ``bk``
#: inputs per K step, ``warps``, ``stages``; ``swap``: the weight tile as the MMA's first operand (``_gemm_kernel``'s
#: SWAP; None: on with 16-row tiles, as measured below); ``split``: programs along K (None: ``gemm``'s rule).
#: Measured (H100, `bench/gpu_all.sh quant_prefill`: every llama-1b / 8b shape, Q4_K_R / Q6_K_R / Q8_0_R,
#: 16..2,048 rows): from 128 rows cuBLAS wins everywhere but the Q8_0_R LM heads. At <= 64 rows, in the
#: twenty-third session, the fused GEMM won only on N >= 16,384 (gate/up, the LM head): a narrower matrix's N / bn
#: programs each walked all of K and lost 2-7x. Since it splits along K (twenty-fourth session) it wins on every
#: matrix of 2^24 weights or more (llama-8b's all but k / v, llama-1b's gate/up, down, head: 8b down Q8_0_R at 16
#: rows 77.3 vs 121.4 us, qkv 34.8 vs 53.5, Q4_K_R down 113.7 vs 121.1) and loses by 0-30 % below it (8b k/v
#: Q4_K_R 16.0 vs 13.0, 1b qkv 16.9 vs 13.6); at the threshold it is within 4 % either way (1b down Q4_K_R 35.0
#: vs 33.5, 8b o 32.9 vs 33.9). Its tiling, swept (twenty-fourth session, `bench/gpu_all.sh quant_gemm_sweep`: 60
#: tilings, every llama-8b / 1b shape in Q4_K_R and Q8_0_R, summed): at 16 rows bm 16 and 3 stages 2,816 us against
#: 3,131 us for the former (64, 64, 64, 4 warps, 2 stages); at 64 rows 3 stages 2,974 against 3,140. SWAP, swept
#: (twenty-fifth session, H100, the same shapes): at 16 rows 2,679 us against 2,792 without (Q8_0_R 1,058 against
#: 1,141, Q4_K_R 1,621 against 1,651); at 64 rows 2,967 against 2,948: so on with 16-row tiles only
GEMM = {"bm": None, "bn": 64, "bk": 64, "warps": 4, "stages": 3, "swap": None, "path": "auto", "fused_max_m": 64,
        "fused_min_weights": 1 << 24, "split": None, "scratch_elements": 1 << 26}


def configure(gemv: dict | None = None, gemm: dict | None = None) -> tuple[dict, dict]:
    """Update the GEMV / GEMM tuning tables (e.g. ``configure(gemm={"path": "dequant"})``); returns
    copies of the old ones (``configured`` restores them after a ``with`` block)."""
    old = dict(GEMV), dict(GEMM)
    for table, new in ((GEMV, gemv or {}), (GEMM, gemm or {})):
        unknown = set(new) - set(table)
        if unknown:
            raise KeyError(f"unknown quantized-kernel settings {sorted(unknown)}; known: {sorted(table)}")
        table.update(new)
    return old


@contextlib.contextmanager
def configured(gemv: dict | None = None, gemm: dict | None = None) -> Iterator[None]:
    """``configure(gemv, gemm)`` for the body of a ``with`` block, then the tables as they were."""
    old = configure(gemv, gemm)
    try:
        yield
    finally:
        configure(*old)


def _iq4_words() -> tuple[int, ...]:
    """The 16 IQ4 values + 128 as six 24-bit words of three bytes (value i: byte i % 3 of word i // 3;
    int32-safe), so the kernels decode them with shifts: no table in device memory (nothing to copy
    while a CUDA graph is being captured)."""
    from shapeplan.quant.formats import IQ4_VALUES
    v = [x + 128 for x in IQ4_VALUES] + [0, 0]
    return tuple(v[3 * w] | (v[3 * w + 1] << 8) | (v[3 * w + 2] << 16) for w in range(6))


if AVAILABLE:
    _IQ4_W0, _IQ4_W1, _IQ4_W2, _IQ4_W3, _IQ4_W4, _IQ4_W5 = (tl.constexpr(w) for w in _iq4_words())

    @triton.jit
    def _iq4_value(q):
        """IQ4_NL / IQ4_XS code 0..15 -> its value (float32)."""
        word = tl.where(q < 3, _IQ4_W0, tl.where(q < 6, _IQ4_W1, tl.where(q < 9, _IQ4_W2, tl.where(
            q < 12, _IQ4_W3, tl.where(q < 15, _IQ4_W4, _IQ4_W5)))))
        return (((word >> ((q % 3) * 8)) & 255) - 128).to(tl.float32)

    @triton.jit
    def _byte(p, mask):
        return tl.load(p, mask=mask, other=0).to(tl.int32)

    @triton.jit
    def _f16(p, mask):
        """The little-endian float16 at byte pointer(s) ``p``, as float32."""
        v = _byte(p, mask) | (_byte(p + 1, mask) << 8)
        return v.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _signed8(v):
        return tl.where(v >= 128, v - 256, v)

    # -- block types: a chunk is NSUB blocks of SUBLEN elements; blk points at each block ----------
    @triton.jit
    def _dec_int8(d, qs, t, mask):                    # Q8_0, INT8_G*: [d][q int8 x G]; Q8_0_R: d and qs apart
        q = _signed8(_byte(qs + t, mask)).to(tl.float32)
        return q * _f16(d, mask)

    @triton.jit
    def _dec_int4(blk, t, mask, SUBLEN: tl.constexpr):   # Q4_1, INT4_G*: [d][m][nibbles]
        h = SUBLEN // 2
        q = ((_byte(blk + 4 + t % h, mask) >> ((t // h) * 4)) & 15).to(tl.float32)
        return (_f16(blk, mask) * q) + _f16(blk + 2, mask)

    @triton.jit
    def _dec_q4_0(blk, t, mask, NL: tl.constexpr):   # Q4_0 / IQ4_NL: [d][nibbles]
        q = (_byte(blk + 2 + t % 16, mask) >> ((t // 16) * 4)) & 15
        if NL:
            v = _iq4_value(q)
        else:
            v = (q - 8).to(tl.float32)
        return _f16(blk, mask) * v

    @triton.jit
    def _dec_q5(blk, t, mask, HAS_MIN: tl.constexpr):   # Q5_0: [d][qh u32][nibbles]; Q5_1: [d][m][qh][nib]
        base = 4 if HAS_MIN else 2
        low = (_byte(blk + base + 4 + t % 16, mask) >> ((t // 16) * 4)) & 15
        high = (_byte(blk + base + t // 8, mask) >> (t % 8)) & 1
        q = low | (high << 4)
        if HAS_MIN:
            out = (_f16(blk, mask) * q.to(tl.float32)) + _f16(blk + 2, mask)
        else:
            out = _f16(blk, mask) * (q - 16).to(tl.float32)
        return out

    # -- K-quants: a chunk is one super-block at sbk; e = element index in it ------------------------
    @triton.jit
    def _dec_q2_k(sbk, sb, e, mask, mask_s):           # [scales 16][qs 64][d][dmin], sub-blocks of 16
        s = _byte(sbk + sb, mask_s)
        dl = _f16(sbk + 80, mask_s) * (s & 15).to(tl.float32)
        ml = _f16(sbk + 82, mask_s) * (s >> 4).to(tl.float32)
        q = (_byte(sbk + 16 + (e // 128) * 32 + e % 32, mask) >> (((e % 128) // 32) * 2)) & 3
        return dl * q.to(tl.float32) - ml

    @triton.jit
    def _dec_q3_k(sbk, sb, e, mask, mask_s):           # [hmask 32][qs 64][scales 12][d]
        lo = (_byte(sbk + 96 + sb % 8, mask_s) >> ((sb // 8) * 4)) & 15
        hi = (_byte(sbk + 104 + sb % 4, mask_s) >> ((sb // 4) * 2)) & 3
        dl = _f16(sbk + 108, mask_s) * ((lo | (hi << 4)) - 32).to(tl.float32)
        ql = (_byte(sbk + 32 + (e // 128) * 32 + e % 32, mask) >> (((e % 128) // 32) * 2)) & 3
        hb = (_byte(sbk + e % 32, mask) >> (e // 32)) & 1
        return dl * (ql - 4 + 4 * hb).to(tl.float32)

    @triton.jit
    def _scale_min_k4(sbk, sb, mask_s):
        j = sb % 4
        a, b, c = _byte(sbk + 4 + j, mask_s), _byte(sbk + 8 + j, mask_s), _byte(sbk + 12 + j, mask_s)
        sc = tl.where(sb < 4, a & 63, (c & 15) | ((a >> 6) << 4))
        mn = tl.where(sb < 4, b & 63, (c >> 4) | ((b >> 6) << 4))
        return sc, mn

    @triton.jit
    def _dec_q45_k(sbk, qs, sb, t, mask, mask_s, FIVE: tl.constexpr):   # [d][dmin][scales 12]([qh 32])[qs 128]
        """``sbk``: the super-block's header ([d][dmin][scales]); ``qs``: its 128 code bytes (in the file's
        layout 16 / 48 bytes further, in Q4_K_R's apart)."""
        sc, mn = _scale_min_k4(sbk, sb, mask_s)
        d = _f16(sbk, mask_s) * sc.to(tl.float32)
        dm = _f16(sbk + 2, mask_s) * mn.to(tl.float32)
        q = (_byte(qs + (sb // 2) * 32 + t, mask) >> ((sb % 2) * 4)) & 15
        if FIVE:
            q = q | (((_byte(sbk + 16 + t, mask) >> sb) & 1) << 4)
        return d * q.to(tl.float32) - dm

    @triton.jit
    def _dec_q6_k(qs, scp, dp, sb, e, mask, mask_s):   # [ql 128][qh 64][scales int8 16][d]; Q6_K_R: 3 runs
        r = e % 128
        h = e // 128
        low = (_byte(qs + h * 64 + r % 64, mask) >> ((r // 64) * 4)) & 15
        high = (_byte(qs + 128 + h * 32 + r % 32, mask) >> ((r // 32) * 2)) & 3
        d = _f16(dp, mask_s) * _signed8(_byte(scp + sb, mask_s)).to(tl.float32)
        return d * ((low | (high << 4)) - 32).to(tl.float32)

    @triton.jit
    def _dec_iq4_xs(sbk, sb, t, mask, mask_s):   # [d][scales_h u16][scales_l 4][qs 128]
        hs = (_byte(sbk + 2 + sb // 4, mask_s) >> ((sb % 4) * 2)) & 3
        ls = (_byte(sbk + 4 + sb // 2, mask_s) >> ((sb % 2) * 4)) & 15
        dl = _f16(sbk, mask_s) * ((ls | (hs << 4)) - 32).to(tl.float32)
        q = (_byte(sbk + 8 + sb * 16 + t % 16, mask) >> ((t // 16) * 4)) & 15
        return dl * _iq4_value(q)

    @triton.jit
    def _decode(rb, c, row_ok, K, KIND: tl.constexpr, TS: tl.constexpr, NSUB: tl.constexpr,
                SUBLEN: tl.constexpr, SB0=0, NT: tl.constexpr = 0):
        """Chunk ``c`` of the rows at byte pointers ``rb`` [BN] -> float32 [BN, NSUB, SUBLEN]; with ``NT``,
        only its sub-blocks SB0 .. SB0 + NT - 1: [BN, NT, SUBLEN] (a smaller K tile)."""
        if NT == 0:
            sb = tl.arange(0, NSUB)[None, :, None]
        else:
            sb = SB0 + tl.arange(0, NT)[None, :, None]
        t = tl.arange(0, SUBLEN)[None, None, :]
        p = rb[:, None, None]
        mask_s = row_ok[:, None, None] & (c * 256 + sb * SUBLEN < K)      # [BN, NSUB, 1]
        if KIND < 10:
            blk = p + (c * NSUB + sb) * TS
            if KIND == 0:
                w = _dec_int8(blk, blk + 2, t, mask_s)
            elif KIND == 1:
                w = _dec_int4(blk, t, mask_s, SUBLEN)
            elif KIND == 2:
                w = _dec_q4_0(blk, t, mask_s, False)
            elif KIND == 3:
                w = _dec_q5(blk, t, mask_s, False)
            elif KIND == 4:
                w = _dec_q5(blk, t, mask_s, True)
            else:
                w = _dec_q4_0(blk, t, mask_s, True)
        elif KIND == 17:                    # Q8_0_R: a row is [codes 32 x blocks][d 2 x blocks], K code bytes first
            b = c * NSUB + sb
            w = _dec_int8(p + K + b * 2, p + b * 32, t, mask_s)
        else:
            sbk = p + c * TS
            e = sb * SUBLEN + t
            if KIND == 10:
                w = _dec_q2_k(sbk, sb, e, mask_s, mask_s)
            elif KIND == 11:
                w = _dec_q3_k(sbk, sb, e, mask_s, mask_s)
            elif KIND == 12:
                w = _dec_q45_k(sbk, sbk + 16, sb, t, mask_s, mask_s, False)
            elif KIND == 13:
                w = _dec_q45_k(sbk, sbk + 48, sb, t, mask_s, mask_s, True)
            elif KIND == 16:                # Q4_K_R: a row is [codes 128 x S][headers 16 x S]
                w = _dec_q45_k(p + tl.cdiv(K, 256) * 128 + c * 16, p + c * 128, sb, t, mask_s, mask_s, False)
            elif KIND == 14:
                w = _dec_q6_k(sbk, sbk + 192, sbk + 208, sb, e, mask_s, mask_s)
            elif KIND == 18:                # Q6_K_R: a row is [ql + qh 192 x S][scales 16 x S][d 2 x S]
                S = tl.cdiv(K, 256)
                w = _dec_q6_k(p + c * 192, p + S * 192 + c * 16, p + S * 208 + c * 2, sb, e, mask_s, mask_s)
            else:
                w = _dec_iq4_xs(sbk, sb, t, mask_s, mask_s)
        return w

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, ROW_BYTES, stride_xm, stride_ym, CHUNKS_PER_PROGRAM,
                     M: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, KIND: tl.constexpr, TS: tl.constexpr,
                     NSUB: tl.constexpr, SUBLEN: tl.constexpr, PARTIAL: tl.constexpr, UNROLL: tl.constexpr):
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        rows = pid_n * BN + tl.arange(0, BN)
        row_ok = rows < N
        rb = w_ptr + rows.to(tl.int64) * ROW_BYTES
        xoff = tl.arange(0, NSUB)[:, None] * SUBLEN + tl.arange(0, SUBLEN)[None, :]     # [NSUB, SUBLEN]
        mrow = tl.arange(0, BM)[:, None]
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc1 = tl.zeros([BN, NSUB, SUBLEN], dtype=tl.float32)
        c0 = pid_k * CHUNKS_PER_PROGRAM
        c1 = tl.minimum(c0 + CHUNKS_PER_PROGRAM, tl.cdiv(K, 256))
        for c in range(c0, c1, UNROLL):
            for u in tl.static_range(UNROLL):          # UNROLL chunks' loads in flight together
                cu = c + u
                ok = rows < tl.where(cu < c1, N, 0)          # chunks past this program's run: masked
                w = _decode(rb, cu, ok, K, KIND, TS, NSUB, SUBLEN)                  # [BN, NSUB, SUBLEN]
                k = cu * 256 + xoff
                for m in tl.static_range(M):
                    xm = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
                    if M == 1:                 # products summed once, after the loop (fewer shuffles)
                        acc1 += w * xm[None, :, :]
                    else:
                        part = tl.sum(tl.sum(w * xm[None, :, :], axis=2), axis=1)        # [BN]
                        acc = tl.where(mrow == m, acc + part[None, :], acc)
        if M == 1:
            acc = tl.where(mrow == 0, tl.sum(tl.sum(acc1, axis=2), axis=1)[None, :], acc)
        out_mask = (mrow < M) & row_ok[None, :]
        if PARTIAL:                                    # float32 partials [SPLIT, M, N]
            tl.store(y_ptr + (pid_k * M + mrow) * N + rows[None, :], acc, mask=out_mask)
        else:
            tl.store(y_ptr + mrow * stride_ym + rows[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _splitk_reduce(part_ptr, y_ptr, N, total, stride_ym, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < total
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(part_ptr + s * total + i, mask=ok, other=0.0)
        tl.store(y_ptr + (i // N) * stride_ym + i % N, acc.to(y_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _store_tile(Y, acc, ms, rows, M, N, stride_ym, pid_s, PARTIAL: tl.constexpr, SWAP: tl.constexpr):
        """A GEMM program's output tile ``acc`` [BM, BN] of rows ``ms`` and columns ``rows`` (SWAP: [BN, BM],
        acc[r, m] is y[m, r]) into Y, cast to its dtype; PARTIAL: float32 sums into split ``pid_s`` of
        [splits, M, N] partials."""
        if SWAP:
            mi, ri = ms[None, :].to(tl.int64), rows[:, None]
        else:
            mi, ri = ms[:, None].to(tl.int64), rows[None, :]
        out = (mi < M) & (ri < N)
        if PARTIAL:
            tl.store(Y + pid_s.to(tl.int64) * M * N + mi * N + ri, acc, mask=out)
        else:
            tl.store(Y + mi * stride_ym + ri, acc.to(Y.dtype.element_ty), mask=out)

    @triton.jit
    def _gemm_kernel(x_ptr, w_ptr, y_ptr, M, N, K, ROW_BYTES, stride_xm, stride_ym, PER,
                     BM: tl.constexpr, BN: tl.constexpr, KIND: tl.constexpr, TS: tl.constexpr,
                     NSUB: tl.constexpr, SUBLEN: tl.constexpr, NT: tl.constexpr, IEEE: tl.constexpr,
                     PARTIAL: tl.constexpr, SWAP: tl.constexpr):
        """y = x @ W.T, K tiles of NT sub-blocks (NT * SUBLEN elements) dequantized into tl.dot; program
        (m, n, s) takes K tiles s * PER .. (s + 1) * PER - 1 (PARTIAL: of several splits, whose float32 sums
        go to y_ptr as [splits, M, N] for ``_splitk_reduce``). SWAP: y.T = W @ x.T instead, the weight tile as
        the MMA's first operand (its BN rows the MMA's M, the few x rows its N: Hopper's warpgroup MMA needs
        64+ rows there, and takes that operand from registers)."""
        pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rows = pid_n * BN + tl.arange(0, BN)
        row_ok = rows < N
        rb = w_ptr + rows.to(tl.int64) * ROW_BYTES
        ms = pid_m * BM + tl.arange(0, BM)
        kk = tl.arange(0, NT * SUBLEN)
        acc = tl.zeros([BN, BM] if SWAP else [BM, BN], dtype=tl.float32)
        tiles = NSUB // NT                                          # K tiles per 256-element chunk
        for i in range(pid_s * PER, tl.minimum((pid_s + 1) * PER, tl.cdiv(K, 256) * tiles)):
            c = i // tiles
            sb0 = (i % tiles) * NT
            w = _decode(rb, c, row_ok, K, KIND, TS, NSUB, SUBLEN, sb0, NT)             # [BN, NT, SUBLEN]
            w2 = tl.reshape(w, (BN, NT * SUBLEN)).to(x_ptr.dtype.element_ty)
            k = c * 256 + sb0 * SUBLEN + kk
            xt = tl.load(x_ptr + ms[:, None].to(tl.int64) * stride_xm + k[None, :],
                         mask=(ms[:, None] < M) & (k[None, :] < K), other=0.0)
            if SWAP:
                a, b = w2, tl.trans(xt)
            else:
                a, b = xt, tl.trans(w2)
            if IEEE:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
        _store_tile(y_ptr, acc, ms, rows, M, N, stride_ym, pid_s, PARTIAL, SWAP)

    @triton.jit
    def _rows_kernel(w_ptr, idx_ptr, out_ptr, R, K, ROW_BYTES, stride_o, BN: tl.constexpr,
                     HAS_IDX: tl.constexpr, KIND: tl.constexpr, TS: tl.constexpr, NSUB: tl.constexpr,
                     SUBLEN: tl.constexpr):
        """out[r, :] = dequantized row idx[r] (or row r); grid (cdiv(R, BN), chunks)."""
        r = tl.program_id(0) * BN + tl.arange(0, BN)
        c = tl.program_id(1)
        ok = r < R
        if HAS_IDX:
            src = tl.load(idx_ptr + r, mask=ok, other=0).to(tl.int64)
        else:
            src = r.to(tl.int64)
        w = _decode(w_ptr + src * ROW_BYTES, c, ok, K, KIND, TS, NSUB, SUBLEN)
        k = c * 256 + tl.arange(0, NSUB)[None, :, None] * SUBLEN + tl.arange(0, SUBLEN)[None, None, :]
        tl.store(out_ptr + r.to(tl.int64)[:, None, None] * stride_o + k, w.to(out_ptr.dtype.element_ty),
                 mask=ok[:, None, None] & (k < K))


# --------------------------------------------------------------------------------------- launching
_SMS: dict[int, int] = {}


def _programs_wanted(device: torch.device) -> int:
    """Programs a kernel should have before it is worth splitting along K: the SM count (1 off CUDA)."""
    if GEMV["min_programs"] or device.type != "cuda":
        return GEMV["min_programs"] or 1
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _meta(q) -> dict:
    return dict(KIND=KINDS[q.kind], TS=q.type_size, NSUB=q.tile[0], SUBLEN=q.tile[1])


def _split_k(units: int, blocks: int, wanted: int, split: int | None) -> tuple[int, int]:
    """(splits, units per split) of a K loop of ``units`` steps over ``blocks`` output blocks: ``split``, or
    enough for ``wanted`` programs (at most ``units // 2``, at least 1), evened out so none is empty."""
    if split is None:
        split = max(1, min(units // 2, triton.cdiv(wanted, blocks)))
    per = triton.cdiv(units, max(1, split))
    return triton.cdiv(units, per), per


def _tile_split(units: int, blocks: int, device: torch.device, split: int | None) -> tuple[int, int]:
    """``_split_k`` for a GEMM of ``blocks`` output tiles: ``split``, or by default only where the tiles alone
    leave SMs idle, into about 4 programs per SM."""
    sms = _programs_wanted(device)
    return _split_k(units, blocks, 4 * sms if blocks < sms else 0, split)


def _partials(y: torch.Tensor, split: int) -> torch.Tensor:
    """Where a kernel of ``split`` programs along K writes: y itself, or float32 [split, M, N] partials."""
    return y if split == 1 else torch.empty(split, *y.shape, dtype=torch.float32, device=y.device)


def _sum_partials(part: torch.Tensor, y: torch.Tensor, split: int) -> None:
    """y = the sum of ``_partials``' splits, cast to y's dtype (nothing to do for one split)."""
    if split > 1:
        total, block = y.numel(), 1024
        _splitk_reduce[(triton.cdiv(total, block),)](part, y, y.shape[1], total, y.stride(0), SPLIT=split, BLOCK=block)


def gemv(x: torch.Tensor, packed: torch.Tensor, q, n: int, k: int, *, split: int | None = None) -> torch.Tensor:
    """x [M, K] (M <= 8, last dim contiguous) @ W.T -> [M, N] in x's dtype; W = packed rows of ``q``. ``split``:
    programs along K (default: enough for ``_programs_wanted``; 1 when the rows suffice)."""
    m = x.shape[0]
    bn, unroll = GEMV["bn"], GEMV["unroll"]
    blocks_n = triton.cdiv(n, bn)
    split, per = _split_k(triton.cdiv(k, CHUNK), blocks_n, _programs_wanted(x.device), split)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = _partials(y, split)
    _gemv_kernel[(blocks_n, split)](x, packed, part, n, k, packed.stride(0), x.stride(0),
                                   y.stride(0), per, M=m, BM=max(2, _pow2(m)), BN=bn, PARTIAL=split > 1,
                                   UNROLL=unroll, num_warps=GEMV["warps"], **_meta(q))
    _sum_partials(part, y, split)
    return y


def gemm_bm(m: int) -> int:
    """The fused GEMM's rows per program for ``m`` rows: ``GEMM["bm"]``, or by default 16 up to 16 rows (tl.dot's
    least), else 64."""
    return GEMM["bm"] or (16 if m <= 16 else 64)


def gemm_swap(bm: int) -> bool:
    """Whether the fused GEMM with ``bm``-row tiles takes the weight tile as the MMA's first operand:
    ``GEMM["swap"]``, or by default with 16-row tiles only (measured: ``GEMM``'s comment)."""
    return bool(bm == 16 if GEMM["swap"] is None else GEMM["swap"])


def gemm(x: torch.Tensor, packed: torch.Tensor, q, n: int, k: int) -> torch.Tensor:
    """The fused prefill GEMM: x [M, K] @ W.T with W's tiles dequantized into ``tl.dot``; split along K
    (``GEMM["split"]``; by default only where the output tiles alone leave SMs idle, into about 4 programs
    per SM: a narrow matrix's N / bn programs each walking all of K were what lost to cuBLAS, twenty-third
    session), the float32 partial sums then added by ``_splitk_reduce``."""
    m = x.shape[0]
    bm, bn = gemm_bm(m), GEMM["bn"]
    nt = max(1, min(q.tile[0], GEMM["bk"] // q.tile[1]))         # sub-blocks per K tile (>= 16 elements)
    blocks = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split, per = _tile_split(triton.cdiv(k, CHUNK) * (q.tile[0] // nt), blocks, x.device, GEMM["split"])
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    part = _partials(y, split)
    _gemm_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), split)](
        x, packed, part, m, n, k, packed.stride(0), x.stride(0), y.stride(0), per, BM=bm, BN=bn,
        NT=nt, IEEE=x.dtype == torch.float32, PARTIAL=split > 1, SWAP=gemm_swap(bm), num_warps=GEMM["warps"],
        num_stages=GEMM["stages"], **_meta(q))
    _sum_partials(part, y, split)
    return y


def dequantize_rows(packed: torch.Tensor, q, k: int, dtype: torch.dtype, idx: torch.Tensor | None = None,
                    *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``idx`` (int tensor, any shape: flattened) of the packed weight, or all rows, dequantized
    to ``dtype``: [R, K]."""
    r = idx.numel() if idx is not None else packed.shape[0]
    out = torch.empty(r, k, dtype=dtype, device=packed.device) if out is None else out
    if r:
        bn = 4
        src = idx.reshape(-1) if idx is not None else packed
        _rows_kernel[(triton.cdiv(r, bn), triton.cdiv(k, CHUNK))](
            packed, src, out, r, k, packed.stride(0), out.stride(0), BN=bn,
            HAS_IDX=idx is not None, **_meta(q))
    return out


def matmul(x: torch.Tensor, packed: torch.Tensor, q, n: int, k: int) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N]: up to 8 rows of Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / IQ4: the one-row kernel of
    qgemv.py (a program per row and block of outputs); other types the GEMV for M <= 8; above, the fused GEMM
    or dequantize + cuBLAS (``GEMM["path"]``). (A decode step's 3-16 rows of Q8_0_R / Q4_K_R / Q6_K_R: the integer
    tensor-core GEMM of mmq.py, which shapeplan/ops/quantized.py calls.)"""
    if x.stride(-1) != 1:
        x = x.contiguous()
    m = x.shape[0]
    if GEMV1:
        from shapeplan.runtime.backends.triton.kernels import qgemv
        if qgemv.supports(x, packed, q.name, k):
            return qgemv.gemv1(x, packed, q.name, n, k)
    if m <= 8:
        return gemv(x, packed, q, n, k)
    path = GEMM["path"]
    if path == "fused" or (path == "auto" and m <= GEMM["fused_max_m"] and n * k >= GEMM["fused_min_weights"]):
        return gemm(x, packed, q, n, k)
    return dequant_mm(x, packed, q, n, k)


def dequant_mm(x: torch.Tensor, packed: torch.Tensor, q, n: int, k: int) -> torch.Tensor:
    """Dequantize W to a scratch buffer in x's dtype (in row slices of at most ``scratch_elements``)
    and multiply with cuBLAS."""
    rows = max(1, min(n, GEMM["scratch_elements"] // k))
    if rows >= n:
        return x @ dequantize_rows(packed, q, k, x.dtype).t()
    y = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    scratch = torch.empty(rows, k, dtype=x.dtype, device=x.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        w = dequantize_rows(packed[r0:r1], q, k, x.dtype, out=scratch[:r1 - r0])
        y[:, r0:r1].copy_(x @ w.t())
    return y
