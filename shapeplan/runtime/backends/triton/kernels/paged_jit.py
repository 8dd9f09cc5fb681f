"""The Triton kernels of the paged KV cache (launchers and tuning: ``paged.py``).

Pools are block-major, ``[NB, Hkv, BS, D]``: one block of one KV head is BS*D contiguous values.
This module imports Triton and nothing else (no torch, no shapeplan), so a compile worker process can
load it by path.
"""

import triton
import triton.language as tl


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
    d = tl.arange(0, DP)
    m2 = hm[:, None] & (d < D)[None, :]
    v = tl.load(V + b * sv_b + h[:, None] * sv_h + i * sv_s + d[None, :], mask=m2)
    tl.store(VP + blk * svp_n + h[:, None] * svp_h + off * svp_s + d[None, :], v.to(VP.dtype.element_ty), mask=m2)
    kb = K + b * sk_b + h[:, None] * sk_h + i * sk_s
    kpb = KP + blk * skp_n + h[:, None] * skp_h + off * skp_s
    if ROTATE:                                     # RoPE of k, each product rounded to k's dtype as torch does
        j = tl.arange(0, HALFP)
        mh = hm[:, None] & (j < HALF)[None, :]
        if INTERLEAVED:
            lo, hi = 2 * j, 2 * j + 1
        else:
            lo, hi = j, j + HALF
        cs = b * sc_b + i * sc_s + j
        c = tl.load(C + cs, mask=j < HALF, other=0.0).to(K.dtype.element_ty).to(tl.float32)
        s = tl.load(SN + cs, mask=j < HALF, other=0.0).to(K.dtype.element_ty).to(tl.float32)
        x1 = tl.load(kb + lo[None, :], mask=mh, other=0.0).to(tl.float32)
        x2 = tl.load(kb + hi[None, :], mask=mh, other=0.0).to(tl.float32)
        re = (c[None, :] * x1).to(K.dtype.element_ty).to(tl.float32) - \
            (s[None, :] * x2).to(K.dtype.element_ty).to(tl.float32)
        im = (s[None, :] * x1).to(K.dtype.element_ty).to(tl.float32) + \
            (c[None, :] * x2).to(K.dtype.element_ty).to(tl.float32)
        tl.store(kpb + lo[None, :], re.to(K.dtype.element_ty).to(KP.dtype.element_ty), mask=mh)
        tl.store(kpb + hi[None, :], im.to(K.dtype.element_ty).to(KP.dtype.element_ty), mask=mh)
    else:
        k = tl.load(kb + d[None, :], mask=m2)
        tl.store(kpb + d[None, :], k.to(KP.dtype.element_ty), mask=m2)


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
def _paged_partial(q_ptr, k_ptr, v_ptr, pos_ptr, len_ptr, bt_ptr, m_ptr, l_ptr, acc_ptr, c_ptr, s_ptr,
                   sq_b, sq_h, sk_n, sk_h, sk_s, sv_n, sv_h, sv_s, s_bt, sc_b, scale,
                   HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                   NS: tl.constexpr, BPS: tl.constexpr, BS: tl.constexpr, WINDOW: tl.constexpr,
                   ROTATE: tl.constexpr = False, INTERLEAVED: tl.constexpr = False, HALF: tl.constexpr = 1):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // HKV
    h = pid_bh % HKV
    n = tl.load(len_ptr + b)
    pos = tl.load(pos_ptr + b)
    end = tl.where(n > 0, pos + 1, 0)             # keys 0..pos of the row are live; none for padding
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(pos - WINDOW + 1, 0)
    start = tl.maximum(pid_s * BPS * BS, lo)
    stop = tl.minimum((pid_s + 1) * BPS * BS, end)
    if start < stop:                               # splits outside the live range write nothing
        g = tl.arange(0, GP)
        d = tl.arange(0, DP)
        dmask = d < D
        qmask = (g < G)[:, None] & dmask[None, :]
        if ROTATE:                                 # q's RoPE here, not in a kernel of its own
            q = _rotate_q(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h, c_ptr + b * sc_b, s_ptr + b * sc_b,
                          g, d, qmask, HALF, INTERLEAVED)                                  # [GP, DP]
        else:
            q = tl.load(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h + d[None, :],
                        mask=qmask, other=0.0).to(tl.float32)                               # [GP, DP]
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, DP], tl.float32)
        o = tl.arange(0, BS)
        for kb in range(start // BS, (stop + BS - 1) // BS):
            blk = tl.load(bt_ptr + b * s_bt + kb).to(tl.int64)
            offs = kb * BS + o
            valid = (offs >= start) & (offs < stop)
            kv_mask = valid[:, None] & dmask[None, :]
            k = tl.load(k_ptr + blk * sk_n + h * sk_h + o[:, None] * sk_s + d[None, :], mask=kv_mask,
                        other=0.0).to(tl.float32)                                          # [BS, DP]
            v = tl.load(v_ptr + blk * sv_n + h * sv_h + o[:, None] * sv_s + d[None, :], mask=kv_mask,
                        other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                      # [GP, BS]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        base = (pid_bh * NS + pid_s) * GP
        tl.store(m_ptr + base + g, m_i)
        tl.store(l_ptr + base + g, l_i)
        tl.store(acc_ptr + (base + g)[:, None] * DP + d[None, :], acc)


@triton.jit
def _paged_combine(m_ptr, l_ptr, acc_ptr, pos_ptr, len_ptr, o_ptr, so_b, so_h,
                   HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                   NS: tl.constexpr, NSP: tl.constexpr, SPLIT_KEYS: tl.constexpr, WINDOW: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = pid_bh // HKV
    h = pid_bh % HKV
    n = tl.load(len_ptr + b)
    pos = tl.load(pos_ptr + b)
    end = tl.where(n > 0, pos + 1, 0)
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(pos - WINDOW + 1, 0)
    s = tl.arange(0, NSP)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    live = (s >= lo // SPLIT_KEYS) & (s < (end + SPLIT_KEYS - 1) // SPLIT_KEYS)   # the splits pass 1 wrote
    idx = (pid_bh * NS + s[:, None]) * GP + g[None, :]                                # [NSP, GP]
    m = tl.load(m_ptr + idx, mask=live[:, None], other=float("-inf"))
    l = tl.load(l_ptr + idx, mask=live[:, None], other=0.0)
    acc = tl.load(acc_ptr + idx[:, :, None] * DP + d[None, None, :], mask=live[:, None, None], other=0.0)
    mx = tl.max(m, axis=0)                                                            # [GP]
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx[None, :]))                    # dead splits weigh 0
    den = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, :, None] * acc, axis=0) / tl.where(den > 0, den, 1.0)[:, None]  # padding rows: 0
    tl.store(o_ptr + b * so_b + (h * G + g)[:, None] * so_h + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(g < G)[:, None] & (d < D)[None, :])
