"""Launchers of the paged KV cache kernels (the kernels: ``paged_jit.py``).

``paged_cache_write``: one program per (row, token): RoPE of k and both writes into the row's block,
for all KV heads at once; tokens past the row's length write nothing. ``paged_decode_attention``: the
split-K ("flash-decoding") attention of one decode step over each row's blocks, one kernel, grid
(B * Hkv, NS): each program takes BPS blocks of one KV head and the G query heads of its group
(rotating them by RoPE on load when given cos/sin) and writes an online-softmax partial; programs past
the row's position skip the loop, so a step reads only the live blocks; the last of each (row, head)'s
live programs to finish (an atomic counter per (row, head) that only they count) merges their partials,
so the merge never waits for the programs past the position (at batch 1 they are most of the grid, and
many of them start only when a first wave of programs ends). Given this step's
k and v, the program whose split holds the row's position writes them first (``PagedWriteAttention``:
no write kernel of its own in a decode step). Nothing is read on the host: both capture into CUDA
graphs. Runs on CUDA, or on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""
from __future__ import annotations

import torch

from shapeplan import env
from shapeplan.runtime.backends.triton.env import triton   # before the kernels: cache dir, compile workers
from shapeplan.runtime.backends.triton.kernels.paged_jit import _paged_decode, _paged_write

#: pass 1 programs aimed at per step (B * Hkv * NS); the split size follows from it
TARGET_PROGRAMS = 2048
#: most splits per row and head (the merge reads the live ones, a chunk at a time)
MAX_SPLITS = 64
#: floats per thread of one step of the merge's loop ([chunk, G, D] per program); the chunk follows from it
MERGE_FLOATS = 128
#: overrides of the tiling (bench/decode_attention.py --paged sweeps them): partials per merge step, warps
MERGE_CHUNK: int | None = None
DECODE_WARPS: int | None = None
#: the decode kernel's EARLY form, on by default (paged_jit._paged_decode; ``SHAPEPLAN_PAGED_EARLY``, read once
#: here: a benchmark switches it between plans by setting this attribute, as ``bench.decode --paged-forms`` does)
EARLY: bool = env.get("SHAPEPLAN_PAGED_EARLY")
#: with EARLY, program s of a (row, head) takes blocks s, s + NS, .. instead of BPS blocks in a row
STRIDED: bool = False


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def paged_cache_write(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      positions: torch.Tensor, lengths: torch.Tensor, block_tables: torch.Tensor,
                      cos: torch.Tensor | None, sin: torch.Tensor | None, *, interleaved: int = 0):
    """See ``shapeplan.ops.llm.paged_cache_write``."""
    b, hkv, s, d = k.shape
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    rotate = cos is not None
    if rotate:
        cos, sin = cos.expand(b, s, cos.shape[-1]), sin.expand(b, s, sin.shape[-1])
        assert cos.stride(-1) == 1 and cos.stride() == sin.stride()
    half = d // 2
    bt = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    _paged_write[(b * s,)](k, v, k_pool, v_pool, positions, lengths, bt,
                           cos if rotate else k, sin if rotate else k,
                           k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                           k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
                           v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
                           cos.stride(0) if rotate else 0, cos.stride(1) if rotate else 0, bt.stride(0), s,
                           HKV=hkv, HP=_pow2(hkv), D=d, DP=_pow2(d), HALF=half, HALFP=max(_pow2(half), 1),
                           BS=k_pool.shape[2], ROTATE=rotate, INTERLEAVED=bool(interleaved),
                           enable_fp_fusion=False)   # no FMA: each product rounds as torch rounds it
    return k_pool, v_pool


def split_blocks(batch: int, hkv: int, max_blocks: int) -> int:
    """Blocks per pass-1 program: about TARGET_PROGRAMS programs for the whole step."""
    per_head = max(1, min(max_blocks, MAX_SPLITS, TARGET_PROGRAMS // max(1, batch * hkv)))
    return triton.cdiv(max_blocks, per_head)


def _decode_tiling(batch: int, hkv: int, max_blocks: int, gp: int, dp: int) -> dict:
    """The decode kernel's split constants for these shapes (the launch and ``precompile`` share them):
    merge chunks of MERGE_FLOATS floats per thread; 4 warps where a (row, head) has many splits to merge
    (16 or more: batch <= 16 at 8 KV heads and 1,024 keys), else 2 as before (the batched steps, whose
    few splits each walk many blocks: not re-measured). Measured on the H200 at batch 1, 8 KV heads,
    1,024 keys, pos 128 / 384 (``bench.decode_attention --paged``, 2026-12-02, two machines): D 64:
    6.94 / 7.75 µs a call (chunks of 64) against 9.58 / 9.95 with all 64 partials in one load on 2 warps
    (the earlier kernel); D 128: 9.26 / 9.34 (chunks of 32) against 20.02 / 22.68; chunks of 8 or 16
    were slower (a merge step is a round trip to L2), and so were fewer splits (32 per head) everywhere."""
    bps = split_blocks(batch, hkv, max_blocks)
    ns = triton.cdiv(max_blocks, bps)
    warps = DECODE_WARPS or (4 if ns >= 16 else 2)
    chunk = MERGE_CHUNK or max(2, MERGE_FLOATS * 32 * warps // (gp * dp))
    return dict(NS=ns, BPS=bps, MCH=max(2, min(_pow2(chunk), _pow2(ns))), num_warps=warps, EARLY=EARLY,
                BPSP=max(2, _pow2(bps)), STRIDED=bool(STRIDED and EARLY))


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, positions: torch.Tensor,
                           lengths: torch.Tensor, block_tables: torch.Tensor, *, scale: float,
                           window: int = 0, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
                           interleaved: int = 0, k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                           counters: torch.Tensor | None = None, rope_table: bool = False,
                           x_codes: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, 1, D] (last dim contiguous); pools [NB, Hkv, BS, D]; positions, lengths int64 [B];
    block_tables int32 [B, MAXB]. With ``cos``/``sin`` ([B, 1, D/2], as RotaryEmbedding takes them; with
    ``rope_table`` the tables [L, D/2], read at each row's position) q is rotated first, on load (no
    RoPE kernel of its own). With ``k``/``v`` ([B, Hkv, 1, D]) this step's
    keys (rotated by cos/sin) and values are written into the pools first, by the same kernel
    (``PagedWriteAttention``). ``counters``: int32 zeros, at least B * Hkv of them, that the kernel
    leaves zero (the last program of each (row, head) merges the splits); a state variable of the graph
    (none: zeros made here, one fill more). Returns [B, Hq, 1, D] in q's dtype (zeros for padding rows);
    with ``x_codes`` (D a multiple of 32) also row 0's output flattened ([Hq * D], the o projection's x) as
    int8 codes per block of 32, int32 [x_code_words(Hq * D)] (qgemv.quantize_x's buffer, written by
    the merges: no kernel of its own)."""
    b, hq, s, d = q.shape
    _, hkv, bs, _ = k_pool.shape
    assert s == 1 and q.stride(-1) == 1 and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    g = hq // hkv
    gp, dp = max(_pow2(g), 2), _pow2(d)
    tiling = _decode_tiling(b, hkv, block_tables.shape[1], gp, dp)
    ns = tiling["NS"]
    bt = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    dev = q.device
    if counters is None:
        counters = torch.zeros(b * hkv, dtype=torch.int32, device=dev)
    elif counters.numel() < b * hkv or counters.dtype != torch.int32:
        raise ValueError(f"paged decode attention: counters must be int32 with at least B * Hkv = {b * hkv} "
                         f"entries, got {counters.dtype} with {counters.numel()}")
    m = torch.empty(b * hkv * ns * gp, dtype=torch.float32, device=dev)
    l = torch.empty_like(m)
    acc = torch.empty(b * hkv * ns * gp * dp, dtype=torch.float32, device=dev)
    out = torch.empty(b, hq, 1, d, dtype=q.dtype, device=dev)
    rotate = cos is not None
    if rotate and not rope_table:
        cos, sin = cos.expand(b, 1, d // 2), sin.expand(b, 1, d // 2)
    if rotate and (cos.stride(-1) != 1 or cos.stride() != sin.stride()):
        cos, sin = cos.contiguous(), sin.contiguous()
    write = k is not None
    if write:
        assert k.stride(-1) == 1 and v.stride(-1) == 1 and k.shape == v.shape == (b, hkv, 1, d)
    from shapeplan.runtime.backends.triton.kernels import gemv
    launch = {"launch_pdl": True} if gemv.pdl(q) else {}
    codes = xw = xd = xs = None
    if x_codes:
        from shapeplan.runtime.backends.triton.kernels import qgemv
        if d % 32:
            raise ValueError(f"paged decode attention: x_codes needs a head size that is a multiple of 32, got {d}")
        codes = qgemv.x_code_buffer(hq * d, dev)
        xw, xd, xs = qgemv.x_code_views(codes, hq * d)
    _paged_decode[(b * hkv, ns)](q, k_pool, v_pool, positions, lengths, bt, m, l, acc, counters, out,
                                 cos if rotate else q, sin if rotate else q, k if write else q, v if write else q,
                                 xw if x_codes else q, xd if x_codes else q, xs if x_codes else q,
                                 q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
                                 v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), bt.stride(0),
                                 cos.stride(0) if rotate else 0, out.stride(0), out.stride(1),
                                 k.stride(0) if write else 0, k.stride(1) if write else 0,
                                 v.stride(0) if write else 0, v.stride(1) if write else 0, scale,
                                 HKV=hkv, G=g, GP=gp, D=d, DP=dp, BS=bs, WINDOW=window, ROTATE=rotate,
                                 INTERLEAVED=bool(interleaved), HALF=max(1, d // 2), HALFP=max(_pow2(d // 2), 1),
                                 WRITE=write, TABLE=bool(rotate and rope_table), PDL=bool(launch),
                                 XQ_OUT=bool(x_codes), **tiling, **launch,
                                 enable_fp_fusion=False)   # k's rotation rounds as torch's (and _paged_write's)
    return (out, codes) if x_codes else out


def precompile(part: str, *, batch: int, hq: int, hkv: int, d: int, block_size: int, max_blocks: int,
               num_blocks: int, dtype: torch.dtype, window: int = 0, x_codes: bool = False) -> None:
    """Compile one kernel (``part``: "write" or "decode") for these shapes without touching
    the device (Triton's ``warmup``: no allocation, no launch, safe beside a capture on another thread):
    the pipeline's start-up compiles them in the background while the graph is built. Strides are those
    of contiguous pools [NB, Hkv, BS, D] and of the q/k/v views of the q/k/v projection the model passes;
    ``x_codes``: the decode kernel that also writes the o projection's x as codes."""
    from shapeplan.runtime.backends.triton.env import interpreting
    if interpreting():                         # the interpreter compiles nothing
        return
    f32, i64, i32 = torch.float32, torch.int64, torch.int32
    g = hq // hkv
    gp, dp = max(_pow2(g), 2), _pow2(d)
    sk = (hkv * block_size * d, block_size * d, d)
    if part == "write":                        # k/v: [B, Hkv, S=1, D] views of the q/k/v projection
        row = (hq + 2 * hkv) * d
        _paged_write.warmup(dtype, dtype, dtype, dtype, i64, i64, i32, dtype, dtype,
                            row, d, row, row, d, row, *sk, *sk, d // 2, d // 2, max_blocks, 1,
                            HKV=hkv, HP=_pow2(hkv), D=d, DP=dp, HALF=d // 2, HALFP=max(_pow2(d // 2), 1),
                            BS=block_size, ROTATE=True, INTERLEAVED=False, enable_fp_fusion=False, grid=(batch,))
        return
    tiling = _decode_tiling(batch, hkv, max_blocks, gp, dp)
    # "decode": PagedWriteAttention's kernel (the LLM graph's decode step: q, k and v views of the q/k/v
    # projection, q rotated inside, this step's k/v written first); the rotary tables [L, D/2]
    row = (hq + 2 * hkv) * d
    from shapeplan.runtime.backends.triton.kernels import gemv
    launch = {"launch_pdl": True} if gemv.pdl_on(torch.device("cuda")) else {}
    xq = (i32, f32, f32) if x_codes else (dtype, dtype, dtype)
    _paged_decode.warmup(dtype, dtype, dtype, i64, i64, i32, f32, f32, f32, i32, dtype, dtype, dtype, dtype, dtype, *xq,
                         row, d, *sk, *sk, max_blocks, d // 2, hq * d, d, row, d, row, d, d ** -0.5,
                         HKV=hkv, G=g, GP=gp, D=d, DP=dp, BS=block_size, WINDOW=window, ROTATE=True,
                         INTERLEAVED=False, HALF=max(1, d // 2), HALFP=max(_pow2(d // 2), 1), WRITE=True, TABLE=True,
                         PDL=bool(launch), XQ_OUT=x_codes, enable_fp_fusion=False, grid=(batch * hkv, tiling["NS"]),
                         **tiling, **launch)
