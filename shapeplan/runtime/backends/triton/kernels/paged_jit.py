"""The Triton kernels of the paged KV cache (launchers and tuning: ``paged.py``).

Pools are block-major, ``[NB, Hkv, BS, D]``: one block of one KV head is BS*D contiguous values.
This module imports Triton and nothing else (no torch, no shapeplan), so a compile worker process can
load it by path.
"""

import triton
import triton.language as tl

try:                                       # grid dependency control (Hopper+): Triton 3.3 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:                        # then PDL stays off (the launcher asks kernels/gemv.pdl)
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _paged_write(K, V, KP, VP, POS, LEN, BT, C, SN,
                 sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, skp_n, skp_h, skp_s, svp_n, svp_h, svp_s,
                 sc_b, sc_s, s_bt, S,
                 HKV: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, HALF: tl.constexpr,
                 HALFP: tl.constexpr, BS: tl.constexpr, ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)            # one token of one row: all its KV heads
    b = pid // S
    i = pid % S
    ok = i < tl.load(LEN + b)                      # tokens past the row's length (padding) write nothing
    p = tl.load(POS + b).to(tl.int64) + i
    blk = tl.load(BT + b * s_bt + p // BS, mask=ok, other=0).to(tl.int64)
    off = p % BS
    h = tl.arange(0, HP)
    hm = h < tl.where(ok, HKV, 0)                  # (a scalar mask folded in this way: see the interpreter)
    _write_token(K + b * sk_b + h[:, None] * sk_h + i * sk_s, V + b * sv_b + h[:, None] * sv_h + i * sv_s,
                 KP + blk * skp_n + h[:, None] * skp_h + off * skp_s, VP + blk * svp_n + h[:, None] * svp_h + off * svp_s,
                 C + b * sc_b + i * sc_s, SN + b * sc_b + i * sc_s, hm, D, DP, HALF, HALFP, ROTATE, INTERLEAVED)


@triton.jit
def _write_token(kb, vb, kpb, vpb, c_row, s_row, hm, D: tl.constexpr, DP: tl.constexpr, HALF: tl.constexpr,
                 HALFP: tl.constexpr, ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """One token's k (rotated by RoPE with cos/sin at c_row / s_row) and v into their pool slots: kb, vb,
    kpb, vpb are pointer columns [HP, 1] (one row per KV head, ``hm`` the live heads). Each product of the
    rotation is rounded to k's dtype as torch rounds it (launch with enable_fp_fusion=False)."""
    d = tl.arange(0, DP)
    m2 = hm[:, None] & (d < D)[None, :]
    v = tl.load(vb + d[None, :], mask=m2)
    tl.store(vpb + d[None, :], v.to(vpb.dtype.element_ty), mask=m2)
    kdt = kb.dtype.element_ty
    if ROTATE:
        j = tl.arange(0, HALFP)
        mh = hm[:, None] & (j < HALF)[None, :]
        if INTERLEAVED:
            lo, hi = 2 * j, 2 * j + 1
        else:
            lo, hi = j, j + HALF
        c = tl.load(c_row + j, mask=j < HALF, other=0.0).to(kdt).to(tl.float32)
        s = tl.load(s_row + j, mask=j < HALF, other=0.0).to(kdt).to(tl.float32)
        x1 = tl.load(kb + lo[None, :], mask=mh, other=0.0).to(tl.float32)
        x2 = tl.load(kb + hi[None, :], mask=mh, other=0.0).to(tl.float32)
        re = (c[None, :] * x1).to(kdt).to(tl.float32) - (s[None, :] * x2).to(kdt).to(tl.float32)
        im = (s[None, :] * x1).to(kdt).to(tl.float32) + (c[None, :] * x2).to(kdt).to(tl.float32)
        tl.store(kpb + lo[None, :], re.to(kdt).to(kpb.dtype.element_ty), mask=mh)
        tl.store(kpb + hi[None, :], im.to(kdt).to(kpb.dtype.element_ty), mask=mh)
    else:
        k = tl.load(kb + d[None, :], mask=m2)
        tl.store(kpb + d[None, :], k.to(kpb.dtype.element_ty), mask=m2)


@triton.jit
def _rotate_q(q_ptr, c_ptr, s_ptr, g, d, mask, HALF: tl.constexpr, INTERLEAVED: tl.constexpr):
    """q [GP, DP] (rows of query heads at q_ptr + g * stride, folded into the pointers) rotated by RoPE
    with cos/sin [HALF] at c_ptr / s_ptr, each product rounded to q's dtype as the RotaryEmbedding
    kernel rounds, the result rounded once more (the rotated q it would store); float32."""
    if INTERLEAVED:
        j = d // 2
        first = d % 2 == 0
        partner = d + tl.where(first, 1, -1)
    else:
        first = d < HALF
        j = tl.where(first, d, d - HALF)
        partner = tl.where(first, d + HALF, d - HALF)
    dt = q_ptr.dtype.element_ty
    x = tl.load(q_ptr + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(q_ptr + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + j, mask=j < HALF, other=0.0).to(dt).to(tl.float32)[None, :]
    s = tl.load(s_ptr + j, mask=j < HALF, other=0.0).to(dt).to(tl.float32)[None, :]
    re = (c * x).to(dt).to(tl.float32) - (s * xp).to(dt).to(tl.float32)       # first of a pair
    im = (s * xp).to(dt).to(tl.float32) + (c * x).to(dt).to(tl.float32)       # second of a pair
    return tl.where(first[None, :], re, im).to(dt).to(tl.float32)


@triton.jit
def _load_q(q_ptr, b, h, g, d, qmask, c_row, s_row, sq_b, sq_h, G: tl.constexpr, HALF: tl.constexpr,
            ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The G query heads of KV head h, row b, [GP, DP] float32 (rows ``g``, ``qmask`` the live ones): rotated by
    RoPE on load with ROTATE (``_rotate_q``: q's RoPE has no kernel of its own)."""
    if ROTATE:
        q = _rotate_q(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h, c_row, s_row, g, d, qmask, HALF, INTERLEAVED)
    else:
        q = tl.load(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h + d[None, :], mask=qmask, other=0.0
                    ).to(tl.float32)
    return q


@triton.jit
def _online(q, k, v, valid, m_i, l_i, acc, scale):
    """One tile of keys k / values v [BS, DP] (``valid`` [BS]) into the online softmax of q [GP, DP]."""
    s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                              # [GP, BS]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    return m_new, l_i, acc


@triton.jit
def _x_blocks(v):
    """Blocks of 32 values v [R, 8, 4] (float32; element 4j + b of block r at [r, j, b]) as int8 codes
    round(v * 127 / max|v|), four to an int32 word (byte b of word j), with each block's scale max|v| / 127
    and its exact sum: x as the one-row quantized GEMV's XQ = 2 / 3 read it (kernels/qgemv.py). Shared by
    qgemv's x quantizer and the paged decode attention's merge (``XQ_OUT``), so that both give the same
    codes; both launch with ``enable_fp_fusion=False`` (``v * inv + 0.5`` rounds twice, as torch's does)."""
    amax = tl.max(tl.max(tl.abs(v), axis=2), axis=1)                           # [R]
    inv = tl.where(amax > 0.0, 127.0 / amax, 0.0)
    q = tl.floor(v * inv[:, None, None] + 0.5).to(tl.int32)                   # -127 .. 127
    b = tl.arange(0, 4)[None, None, :]
    words = tl.sum((q & 0xFF) << (8 * b), axis=2)                              # [R, 8]; bytes disjoint
    return words, amax / 127.0, tl.sum(tl.sum(v, axis=2), axis=1)


@triton.jit
def _kv_tile(k_ptr, v_ptr, blk, kb, h, o, d, start, stop, pos, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s,
             dmask, BS: tl.constexpr, WRITE: tl.constexpr):
    """Block kb's keys and values [BS, DP] (float32; masked past the live range, and with WRITE the row at
    ``pos``, which the caller patches from registers)."""
    offs = kb * BS + o
    live = (offs >= start) & (offs < stop)
    if WRITE:
        live = live & (offs != pos)
    m = live[:, None] & dmask[None, :]
    k = tl.load(k_ptr + blk * sk_n + h * sk_h + o[:, None] * sk_s + d[None, :], mask=m, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + blk * sv_n + h * sv_h + o[:, None] * sv_s + d[None, :], mask=m, other=0.0).to(tl.float32)
    return k, v


@triton.jit
def _early_split(q_ptr, k_ptr, v_ptr, kn_ptr, vn_ptr, m_ptr, l_ptr, acc_ptr, c_row, s_row, blks, jb,
                 b, h, n, pos, kstart, kstop, kb0, step, nblk, part, g, d, dmask,
                 sq_b, sq_h, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s, skn_b, skn_h, svn_b, svn_h, scale,
                 G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                 BS: tl.constexpr, ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr, HALF: tl.constexpr,
                 WRITE: tl.constexpr):
    """``_paged_decode``'s pass 1 with EARLY (see there): the partial of one program's ``nblk`` live blocks
    kb0, kb0 + step, .. (table entries ``blks``; keys kstart .. kstop - 1 live) into m / l / acc at ``part``;
    with WRITE the program that holds ``pos`` also writes this step's k (rotated) and v."""
    o = tl.arange(0, BS)
    blk = tl.sum(tl.where(jb == 0, blks, 0))
    k, v = _kv_tile(k_ptr, v_ptr, blk, kb0, h, o, d, kstart, kstop, pos, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s,
                    dmask, BS, WRITE)
    qmask = (g < G)[:, None] & dmask[None, :]
    q = _load_q(q_ptr, b, h, g, d, qmask, c_row, s_row, sq_b, sq_h, G, HALF, ROTATE, INTERLEAVED)
    if WRITE:                                      # this step's token, [1, DP], if this program holds it
        jp = (pos // BS - kb0) // step
        mine = (n > 0) & (pos // BS >= kb0) & ((pos // BS - kb0) % step == 0) & (jp < nblk)
        one = tl.zeros([1, 1], tl.int64)
        r1 = tl.arange(0, 1)
        m1 = (r1 < tl.where(mine, 1, 0))[:, None] & dmask[None, :]
        kdt = kn_ptr.dtype.element_ty
        if ROTATE:
            kr = _rotate_q(kn_ptr + b * skn_b + h * skn_h + one, c_row, s_row, r1, d, m1, HALF, INTERLEAVED)
        else:
            kr = tl.load(kn_ptr + b * skn_b + h * skn_h + one + d[None, :], mask=m1, other=0.0).to(tl.float32)
        vr = tl.load(vn_ptr + b * svn_b + h * svn_h + one + d[None, :], mask=m1, other=0.0)
        kq = kr.to(kdt).to(k_ptr.dtype.element_ty)                # as the pool stores them
        vq = vr.to(v_ptr.dtype.element_ty)
        kpat, vpat = kq.to(tl.float32), vq.to(tl.float32)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    kb = kb0
    for j in range(0, nblk):
        nxt = tl.sum(tl.where(jb == j + 1, blks, 0))
        k2, v2 = _kv_tile(k_ptr, v_ptr, nxt, kb + step, h, o, d, kstart, kstop, pos, sk_n, sk_h, sk_s, sv_n, sv_h,
                          sv_s, dmask, BS, WRITE)  # the next tile in flight while this one is used
        offs = kb * BS + o
        if WRITE:
            at = (offs == pos)[:, None]
            k = tl.where(at, kpat, k)
            v = tl.where(at, vpat, v)
        m_i, l_i, acc = _online(q, k, v, (offs >= kstart) & (offs < kstop), m_i, l_i, acc, scale)
        k, v = k2, v2
        kb += step
    if WRITE:                                      # into the pool for the steps after this one
        blkp = tl.sum(tl.where(jb == jp, blks, 0))
        off = (pos % BS).to(tl.int64)
        tl.store(k_ptr + blkp * sk_n + h * sk_h + off * sk_s + one + d[None, :], kq, mask=m1)
        tl.store(v_ptr + blkp * sv_n + h * sv_h + off * sv_s + one + d[None, :], vq, mask=m1)
    base = part * GP
    tl.store(m_ptr + base + g, m_i)
    tl.store(l_ptr + base + g, l_i)
    tl.store(acc_ptr + (base + g)[:, None] * DP + d[None, :], acc)


@triton.jit
def _paged_decode(q_ptr, k_ptr, v_ptr, pos_ptr, len_ptr, bt_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr, o_ptr, c_ptr, s_ptr,
                  kn_ptr, vn_ptr, xw_ptr, xd_ptr, xs_ptr, sq_b, sq_h, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s, s_bt, sc_b,
                  so_b, so_h, skn_b, skn_h, svn_b, svn_h, scale,
                  HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                  NS: tl.constexpr, BPS: tl.constexpr, MCH: tl.constexpr, BS: tl.constexpr, WINDOW: tl.constexpr,
                  ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr, HALF: tl.constexpr, HALFP: tl.constexpr,
                  WRITE: tl.constexpr, TABLE: tl.constexpr = False, PDL: tl.constexpr = False,
                  XQ_OUT: tl.constexpr = False, EARLY: tl.constexpr = False, BPSP: tl.constexpr = 2,
                  STRIDED: tl.constexpr = False):
    """One decode step's attention, grid (B * Hkv, NS): program (b, h, split) takes BPS blocks of KV head h
    of row b and the G query heads of its group (rotated by RoPE on load with ROTATE: cos/sin rows at
    c_ptr + b * sc_b, or with TABLE the tables' rows at the row's position, c_ptr + pos * sc_b) and writes an
    online-softmax partial; the last of (b, h)'s live programs to finish (a counter per (b, h) in cnt_ptr
    that only they count, left at zero again) merges their partials into the output (a padding row's
    program 0 writes its zeros). The programs that hold no live block count nothing, so the merge does not
    wait for them: at batch 1 most of the grid lies past the position, and with two programs an SM (the
    registers of the merge and the tiles) the grid's second wave could start only when the first ended.
    WRITE: the program whose split holds the row's position first writes this step's k (rotated) and v of
    head h there, as ``_paged_write`` does.
    PDL (programmatic dependent launch): the next kernel may launch at once; this one reads its row's
    length and position, then waits for the kernel before (``gdc_wait``: q, k and v come from it).
    The merge reads only the splits that wrote, MCH of them at a time (an online softmax over chunks):
    reading all NS partials at once ([NS, GP, DP] floats in one program) spilled registers and made the
    merge most of a batch-1 step's attention time.
    XQ_OUT (D a multiple of 32): the merges of row 0 also write that row's output, read back as stored, as
    int8 codes per block of 32 (``_x_blocks``) into xw / xd / xs, which the one-row quantized o projection
    reads instead of launching qgemv's x quantizer (each head's D outputs are whole blocks of x).
    (Loading the split's first key tile before that wait, the writer patching its new row in, made the
    kernel 13.6 instead of 9.8 µs per llama-1b layer on the H200: taken out again.)
    EARLY (``_early_split``): fewer round trips to memory after the wait. The split's block-table entries
    (BPSP >= BPS of them) are read before it (the tables are inputs of the step, copied before its first
    kernel, as the row's length and position are); after it, the first key / value tile, q, and this
    step's k and v are asked for together; the new token's row is patched into its tile from registers
    (rotated and rounded exactly as stored) instead of being stored, fenced and read back, and the pool
    writes go out after the loop; each next tile is loaded before the current one is used.
    STRIDED (with EARLY): program s takes blocks s, s + NS, s + 2 NS, .. of the row (not BPS blocks in a
    row), so that the live blocks are spread over every program whatever the position; the merge then
    reads the programs that held a live block."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    if PDL:                                        # the next kernel (the o projection) may start loading
        gdc_launch_dependents()
    b = pid_bh // HKV
    h = pid_bh % HKV
    n = tl.load(len_ptr + b)
    pos = tl.load(pos_ptr + b)
    end = tl.where(n > 0, pos + 1, 0)             # keys 0..pos of the row are live; none for padding
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(pos - WINDOW + 1, 0)
    first = pid_s * BPS * BS
    start = tl.maximum(first, lo)
    stop = tl.minimum(first + BPS * BS, end)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    dmask = d < D
    if TABLE:                                      # the rotary tables' rows at this row's position
        c_row, s_row = c_ptr + pos * sc_b, s_ptr + pos * sc_b
    else:
        c_row, s_row = c_ptr + b * sc_b, s_ptr + b * sc_b
    klo = lo // BS                                 # the row's live blocks: klo .. khi - 1
    khi = (end + BS - 1) // BS
    live = start < stop                            # this program holds a live block: it writes a partial
    if EARLY:                                      # this program's live blocks, before the wait
        if STRIDED:                                # pid_s, pid_s + NS, ..
            j0 = tl.where(pid_s >= klo, 0, (klo - pid_s + NS - 1) // NS)
            j1 = tl.where(pid_s < khi, (khi - pid_s + NS - 1) // NS, 0)
            kb0 = pid_s + j0 * NS
            nblk = j1 - j0
            step = NS
            kstart = lo
            kstop = end
        else:                                      # BPS in a row
            kb0 = start // BS
            nblk = (stop + BS - 1) // BS - kb0
            step = 1
            kstart = start
            kstop = stop
        live = nblk > 0
        jb = tl.arange(0, BPSP)
        blks = tl.load(bt_ptr + b * s_bt + kb0 + jb * step, mask=jb < nblk, other=0).to(tl.int64)
    if PDL:                                        # q, k and v of this step: the kernel before must be done
        gdc_wait()
    if EARLY:
        if live:
            _early_split(q_ptr, k_ptr, v_ptr, kn_ptr, vn_ptr, m_ptr, l_ptr, acc_ptr, c_row, s_row, blks, jb,
                         b, h, n, pos, kstart, kstop, kb0, step, nblk, pid_bh * NS + pid_s, g, d, dmask,
                         sq_b, sq_h, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s, skn_b, skn_h, svn_b, svn_h, scale,
                         G, GP, D, DP, BS, ROTATE, INTERLEAVED, HALF, WRITE)
    elif WRITE:
        mine = (pos >= first) & (pos < first + BPS * BS) & (n > 0)    # this split holds the new token
        hm = tl.arange(0, 2) < tl.where(mine, 1, 0)                  # [2]: row 0 is head h (row 1 never live)
        blk = tl.load(bt_ptr + b * s_bt + pos // BS, mask=mine, other=0).to(tl.int64)
        off = (pos % BS).to(tl.int64)
        _write_token(kn_ptr + b * skn_b + h * skn_h + tl.zeros([2, 1], tl.int64),
                     vn_ptr + b * svn_b + h * svn_h + tl.zeros([2, 1], tl.int64),
                     k_ptr + blk * sk_n + h * sk_h + off * sk_s + tl.zeros([2, 1], tl.int64),
                     v_ptr + blk * sv_n + h * sv_h + off * sv_s + tl.zeros([2, 1], tl.int64),
                     c_row, s_row, hm, D, DP, HALF, HALFP, ROTATE, INTERLEAVED)
        tl.debug_barrier()                        # the loop below reads that slot back
    if live and not EARLY:                         # splits outside the live range write no partial
        qmask = (g < G)[:, None] & dmask[None, :]
        q = _load_q(q_ptr, b, h, g, d, qmask, c_row, s_row, sq_b, sq_h, G, HALF, ROTATE, INTERLEAVED)  # [GP, DP]
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, DP], tl.float32)
        o = tl.arange(0, BS)
        for kb in range(start // BS, (stop + BS - 1) // BS):
            blk = tl.load(bt_ptr + b * s_bt + kb).to(tl.int64)
            k, v = _kv_tile(k_ptr, v_ptr, blk, kb, h, o, d, start, stop, pos, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s,
                            dmask, BS, False)                                              # [BS, DP]
            offs = kb * BS + o
            m_i, l_i, acc = _online(q, k, v, (offs >= start) & (offs < stop), m_i, l_i, acc, scale)
        base = (pid_bh * NS + pid_s) * GP
        tl.store(m_ptr + base + g, m_i)
        tl.store(l_ptr + base + g, l_i)
        tl.store(acc_ptr + (base + g)[:, None] * DP + d[None, :], acc)
    split = BPS * BS
    if STRIDED:                                    # every program that held a live block wrote
        c_lo = 0
        s_hi = tl.minimum(khi - klo, NS)
    else:
        c_lo = lo // split                                                   # the splits that wrote: c_lo..s_hi-1
        s_hi = (end + split - 1) // split
    tl.debug_barrier()                             # every thread's partial is stored before the count
    merge = pid_s < 0                              # (false, typed as the branches' results)
    if live:                                       # the last of (b, h)'s live programs merges
        merge = tl.atomic_add(cnt_ptr + pid_bh, 1, sem="acq_rel") == s_hi - c_lo - 1
    elif s_hi <= c_lo:                             # nothing live (a padding row): program 0 writes its zeros
        merge = pid_s == 0
    if merge:
        mx = tl.full([GP], float("-inf"), tl.float32)
        den = tl.zeros([GP], tl.float32)
        out = tl.zeros([GP, DP], tl.float32)
        for c in range(c_lo, s_hi, MCH):            # every chunk holds a split that wrote: its max is finite
            sp = c + tl.arange(0, MCH)
            wrote = sp < s_hi
            if STRIDED:                            # the programs klo % NS, .. (mod NS)
                sp = (klo + sp) % NS
            idx = (pid_bh * NS + sp[:, None]) * GP + g[None, :]                  # [MCH, GP]
            m = tl.load(m_ptr + idx, mask=wrote[:, None], other=float("-inf"), cache_modifier=".cg")
            l = tl.load(l_ptr + idx, mask=wrote[:, None], other=0.0, cache_modifier=".cg")
            acc = tl.load(acc_ptr + idx[:, :, None] * DP + d[None, None, :], mask=wrote[:, None, None], other=0.0,
                          cache_modifier=".cg")
            new = tl.maximum(mx, tl.max(m, axis=0))                                          # [GP]
            alpha = tl.where(mx == float("-inf"), 0.0, tl.exp(mx - new))
            w = tl.where(m == float("-inf"), 0.0, tl.exp(m - new[None, :]))                 # dead splits weigh 0
            den = den * alpha + tl.sum(w * l, axis=0)
            out = out * alpha[:, None] + tl.sum(w[:, :, None] * acc, axis=0)
            mx = new
        out = out / tl.where(den > 0, den, 1.0)[:, None]                                   # padding rows: 0
        tl.store(o_ptr + b * so_b + (h * G + g)[:, None] * so_h + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=(g < G)[:, None] & dmask[None, :])
        if XQ_OUT:
            if b == 0:                             # row 0's x of the o projection, G * D / 32 blocks of it
                tl.debug_barrier()                 # the stores above are visible to every thread
                NBLK: tl.constexpr = DP // 32
                xr = tl.arange(0, GP * NBLK)       # (names of their own: Triton types a name once per function)
                xg = xr // NBLK
                xblk = xr % NBLK
                xlive = (xg < G) & (xblk * 32 < D)
                xe = (xblk * 32)[:, None, None] + 4 * tl.arange(0, 8)[None, :, None] + tl.arange(0, 4)[None, None, :]
                xv = tl.load(o_ptr + (h * G + xg)[:, None, None] * so_h + xe, mask=xlive[:, None, None],
                             other=0.0).to(tl.float32)                                        # [R, 8, 4]
                xwords, xscale, xsum = _x_blocks(xv)
                xi = (h * G + xg) * (D // 32) + xblk                      # the block's index in x = out[0] flat
                tl.store(xw_ptr + xi[:, None] * 8 + tl.arange(0, 8)[None, :], xwords, mask=xlive[:, None])
                tl.store(xd_ptr + xi, xscale, mask=xlive)
                tl.store(xs_ptr + xi, xsum, mask=xlive)
        tl.store(cnt_ptr + pid_bh, 0)                                       # zero for the next step
