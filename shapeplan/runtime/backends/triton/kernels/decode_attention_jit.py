"""The two Triton kernels of ``decode_attention`` (the launcher and tuning are there).

This module imports Triton and nothing else (no torch, no shapeplan), so a compile worker process
(``../compile_worker.py``) can load it by path in the time of a Triton import.
"""

import triton
import triton.language as tl


@triton.jit
def _partial(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr,
             sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, scale,
             HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
             NS: tl.constexpr, SPLIT_: tl.constexpr, BN: tl.constexpr, WINDOW: tl.constexpr,
             USE_DOT: tl.constexpr, IEEE: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // HKV
    h = pid_bh % HKV
    pos = tl.load(pos_ptr)
    end = pos + 1                                         # keys 0..pos are live
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(pos - WINDOW + 1, 0)
    start = tl.maximum(pid_s * SPLIT_, lo)
    stop = tl.minimum(pid_s * SPLIT_ + SPLIT_, end)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    gmask = g < G
    dmask = d < D
    q = tl.load(q_ptr + b * sq_b + (h * G + g)[:, None] * sq_h + d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)                       # [GP, DP]
    if not USE_DOT:
        q = q.to(tl.float32)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    for n in range(start, stop, BN):
        offs = n + tl.arange(0, BN)
        valid = offs < stop
        kv_mask = valid[:, None] & dmask[None, :]
        k = tl.load(k_ptr + b * sk_b + h * sk_h + offs[:, None] * sk_l + d[None, :], mask=kv_mask,
                    other=0.0)                                                          # [BN, DP]
        v = tl.load(v_ptr + b * sv_b + h * sv_h + offs[:, None] * sv_l + d[None, :], mask=kv_mask,
                    other=0.0)
        if USE_DOT:
            if IEEE:
                s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee") * scale  # [GP, BN]
            else:
                s = tl.dot(q, tl.trans(k.to(q.dtype))) * scale
        else:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                   # [GP, BN]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
        else:
            pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    base = (pid_bh * NS + pid_s) * GP
    tl.store(m_ptr + base + g, m_i)
    tl.store(l_ptr + base + g, l_i)
    tl.store(acc_ptr + (base + g)[:, None] * DP + d[None, :], acc)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, o_ptr, so_b, so_h,
             HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
             NS: tl.constexpr, NSP: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = pid_bh // HKV
    h = pid_bh % HKV
    s = tl.arange(0, NSP)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    smask = s < NS
    idx = (pid_bh * NS + s[:, None]) * GP + g[None, :]                                # [NSP, GP]
    m = tl.load(m_ptr + idx, mask=smask[:, None], other=float("-inf"))
    l = tl.load(l_ptr + idx, mask=smask[:, None], other=0.0)
    acc = tl.load(acc_ptr + idx[:, :, None] * DP + d[None, None, :], mask=smask[:, None, None], other=0.0)
    mx = tl.max(m, axis=0)                                                            # [GP]
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - mx[None, :]))                    # empty chunks weigh 0
    den = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, :, None] * acc, axis=0) / den[:, None]                          # [GP, DP]
    tl.store(o_ptr + b * so_b + (h * G + g)[:, None] * so_h + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(g < G)[:, None] & (d < D)[None, :])
