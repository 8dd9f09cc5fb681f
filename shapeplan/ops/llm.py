"""LLM decode ops (domain ``shapeplan``): static KV cache writes, attention over a static cache with a
device-resident position, position ids, and in-graph token sampling.

Everything here is written so that a decode step never needs the host: the write position, the
causal mask and the sampling noise are all computed on the device from tensors, so a captured step
(CUDA graph, emulated replay) replays with no host synchronisation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from shapeplan import env
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops._common import triton_kernels
from shapeplan.ops.registry import Trait, register
from shapeplan.ops.shape_fns import same_as

_M32 = 0xFFFFFFFF


def _start(position: torch.Tensor) -> torch.Tensor:
    """The first write position as a 1-element int64 tensor (no host read)."""
    return position.reshape(-1)[:1].to(torch.int64)


@register("CacheWrite", domain="shapeplan", traits=Trait.MUTATES_INPUT | Trait.VIEW, shape=same_as(0))
def cache_write(cache, update, position, *, axis: int = 2):
    """Write ``update`` into ``cache`` in place at ``position .. position + update.shape[axis]`` along
    ``axis``; returns ``cache`` (the same storage) so readers are ordered after the write.

    cache: [B, H, L, D] (any rank), update: same rank with the sequence length S on ``axis``,
    position: int64 on the device, either [1] (the first position) or [S] (one index per row).
    With S = 1 the position tensor is the index itself: a decode step's write is one kernel."""
    s = update.shape[axis]
    idx = position.reshape(-1)
    if idx.numel() != s:
        idx = _start(position) + torch.arange(s, device=cache.device)          # [S]
    cache.index_copy_(axis, idx, update.to(cache.dtype))
    return cache


def _caches_shape(node):
    return [(v.dtype, v.shape) for v in node.inputs[:2]]


@register("CacheWriteKV", domain="shapeplan", traits=Trait.MUTATES_INPUT | Trait.VIEW, shape=_caches_shape)
def cache_write_kv(k_cache, v_cache, k, v, position, cos=None, sin=None, *, axis: int = 2, interleaved: int = 0):
    """Both of a layer's cache writes in one op: ``CacheWrite(k_cache, k, position)`` and
    ``CacheWrite(v_cache, v, position)``; returns ``(k_cache, v_cache)``. With ``cos``/``sin`` (the
    per-step tables RotaryEmbedding takes without position ids, [B, S, D/2]) ``k`` is first rotated,
    ``RotaryEmbedding(k, cos, sin, interleaved)``: the Llama builder passes un-rotated keys here, since
    the keys are only read through the cache. The Triton backend does a decode step's (S = 1) key
    rotation and both writes in one kernel launch instead of three (issue 7)."""
    if cos is not None:
        from shapeplan.ops.transformer import rotary_embedding
        k = rotary_embedding(k, cos, sin, interleaved=interleaved)
    return cache_write(k_cache, k, position, axis=axis), cache_write(v_cache, v, position, axis=axis)


def _position_ids_shape(node):
    ids = node.inputs[0]
    return [(as_dtype("int64"), ids.shape)]


def _row_starts(position: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, 1] int64: one start per row when ``position`` holds ``rows`` values (the batched engine:
    every row at its own position), else its first value for every row."""
    p = position.reshape(-1).to(torch.int64)
    return p.reshape(-1, 1) if p.numel() == rows else p[:1].reshape(1, 1)


@register("PositionIds", domain="shapeplan", shape=_position_ids_shape)
def position_ids(input_ids, position):
    """Absolute positions ``position + arange(S)`` broadcast to ``input_ids``' shape [B, S]; with
    ``position`` of B values (one per row, the batched engine) row b starts at ``position[b]``."""
    b, s = input_ids.shape[0], input_ids.shape[-1]
    pos = _row_starts(position, b) + torch.arange(s, device=input_ids.device)    # [B or 1, S]
    return pos.expand(input_ids.shape).contiguous()


def _mask_shape(node):
    ids = node.inputs[0]
    s = ids.shape[-1] if ids.shape is not None else None
    g = int(node.attrs.get("groups", 1))
    rows = s * g if isinstance(s, int) else (s if g == 1 else None)
    return [(as_dtype(node.attrs.get("dtype", "bool")), (rows, int(node.attrs["kv_length"])))]


@register("CausalMask", domain="shapeplan", shape=_mask_shape)
def causal_mask(input_ids, position, *, kv_length: int, window: int = 0, groups: int = 1, dtype: str = "bool"):
    """The step's attention mask over a static cache, from the device-resident position: [G*S, L],
    row ``g*S + i`` (query i of any head in a group of G) sees key j when ``j <= position + i`` (and
    ``j > position + i - window`` with a sliding window). Built once per step and shared by every
    layer. ``dtype`` "bool" gives a boolean mask; a float dtype gives the additive form (0 / -inf)
    that SDPA would otherwise rebuild from a boolean mask in every layer."""
    s = input_ids.shape[-1]
    qpos = _start(position) + torch.arange(s, device=input_ids.device)           # [S]
    kpos = torch.arange(kv_length, device=input_ids.device)                      # [L]
    mask = kpos[None, :] <= qpos[:, None]                                        # [S, L]
    if window:
        mask = mask & (kpos[None, :] > qpos[:, None] - window)
    mask = mask.repeat(groups, 1) if groups > 1 else mask
    if dtype == "bool":
        return mask
    neg = torch.full((), float("-inf"), dtype=as_dtype(dtype).torch, device=mask.device)
    return torch.zeros((), dtype=neg.dtype, device=mask.device).where(mask, neg)


#: "auto": the Triton split-K kernel for decode steps on CUDA, SDPA otherwise; "sdpa": always SDPA;
#: "triton": the Triton kernel wherever it can run (CPU under TRITON_INTERPRET=1: tests)
_DECODE_ATTENTION = env.get("SHAPEPLAN_LLM_DECODE_ATTENTION")[0]
_triton_failed: list[str] = []


def set_decode_attention(mode: str) -> str:
    """Choose the decode attention implementation (auto | sdpa | triton); returns the previous one."""
    global _DECODE_ATTENTION
    if mode not in ("auto", "sdpa", "triton"):
        raise ValueError(f"decode attention must be auto, sdpa or triton, got {mode!r}")
    old, _DECODE_ATTENTION = _DECODE_ATTENTION, mode
    return old


def _use_triton(q, position) -> bool:
    if position is None or q.shape[2] != 1 or _DECODE_ATTENTION == "sdpa" or _triton_failed:
        return False
    return q.is_cuda or _DECODE_ATTENTION == "triton"


@register("CachedAttention", domain="shapeplan", shape=same_as(0))
def cached_attention(q, k_cache, v_cache, mask, position=None, *, scale: float = 0.0, window: int = 0):
    """Attention of this step's queries over a static KV cache.

    q: [B, Hq, S, D]; k_cache, v_cache: [B, Hkv, L, D], already holding this step's keys; mask: bool
    or additive [G*S, L] from ``shapeplan::CausalMask`` (G = Hq / Hkv), so stale cache entries beyond
    the position are never read and no host sync is needed. Grouped-query attention folds the G query
    heads of a group into the query-row axis, so K/V are never repeated in memory.

    With the optional ``position`` (the same one the mask was built from, and the same ``window``), a
    decode step (S = 1) on CUDA runs a Triton split-K kernel that reads only the live keys instead of
    the whole buffer (shapeplan/runtime/backends/triton/kernels/decode_attention.py); results agree with SDPA to rounding."""
    b, hq, s, d = q.shape
    hkv = k_cache.shape[1]
    if _use_triton(q, position):
        try:
            from shapeplan.runtime.backends.triton.kernels.decode_attention import decode_attention
            return decode_attention(q, k_cache, v_cache, position.reshape(-1)[:1],
                                    scale=scale or d ** -0.5, window=window)
        except Exception as e:  # noqa: BLE001 - e.g. no triton, or an unsupported GPU: fall back, visibly
            _triton_failed.append(f"{type(e).__name__}: {e}")
            from shapeplan import diagnostics
            diagnostics.record("FALLBACK", "CachedAttention: Triton decode kernel unavailable, using SDPA",
                               reason=_triton_failed[-1][:300])
    qg = q.reshape(b, hkv, (hq // hkv) * s, d)                                   # [B, Hkv, G*S, D]
    kc, vc = k_cache.to(q.dtype), v_cache.to(q.dtype)
    out = _efficient_attention(qg, kc, vc, mask, scale or d ** -0.5)
    if out is None:
        out = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask, scale=scale or None)
    return out.reshape(b, hq, s, d)


#: attention that the Triton decode kernel does not run (prefill) on CUDA: "auto": the memory-efficient
#: kernel, called directly, for score matrices of up to EFFICIENT_MAX_SCORES entries per head, SDPA's own
#: choice above; "efficient": that kernel wherever it applies; "sdpa": always SDPA's choice (cuDNN on
#: Hopper with torch >= 2.11)
_PREFILL_ATTENTION = env.get("SHAPEPLAN_LLM_PREFILL_ATTENTION")
EFFICIENT_MAX_SCORES = 1 << 20
_efficient_failed: list[str] = []


def _efficient_attention(q, k, v, mask, scale: float):
    """SDPA's memory-efficient kernel on CUDA, or None (SDPA then chooses). ``mask``: an additive bias
    [M, L] for every row and head (``CachedAttention``) or [B, 1, M, L], one per row (``PagedAttention``'s
    prefill).

    Why: on Hopper, torch >= 2.11 picks cuDNN attention, which builds a cuDNN graph per thread and per
    shape at its first call (its cache is thread-local): 52-69 ms per call on a new thread on the H200
    although another thread had made the same call, 66 ms in the first prefill of a llama-1b pipeline
    whose warm-up thread had (``bench/prefill_attention.py``; docs/benchmarks/decode.md round 8). The
    memory-efficient kernel is a plain kernel: once loaded, every thread's first call costs 0.4-1.3 ms.
    But per call it is slower: 59 vs 40 us at 512 query rows x 1,024 keys, 285 vs 74 us at 2,048 x 4,096,
    781 vs 268 us at 8,192 x 4,096. So ``auto`` takes it only where the score matrix is small (at most
    EFFICIENT_MAX_SCORES entries: llama-1b's 128-token prefill over a 1,024-token cache is 2**19), where
    the first call's cost dominates, and SDPA's choice for larger prefills, whose captured graph
    replays cuDNN's faster kernel at no host cost. Not taken when the kernel is disabled
    (``torch.backends.cuda.enable_mem_efficient_sdp(False)``) or cannot take the inputs; after a failure
    it is not tried again in this process (a FALLBACK event says why)."""
    if _PREFILL_ATTENTION not in ("auto", "efficient") or _efficient_failed or not q.is_cuda or mask is None:
        return None
    b, h, m, _ = q.shape
    if mask.dim() != 2 and not (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[0] in (1, b)):
        return None                           # [M, L] for all, or [B, 1, M, L]: one bias per row (paged prefill)
    if mask.dtype != q.dtype or not mask.is_contiguous() or mask.shape[-1] % 16:
        return None                           # the kernel wants an additive bias with aligned rows
    if _PREFILL_ATTENTION == "auto" and m * mask.shape[-1] > EFFICIENT_MAX_SCORES:
        return None
    bias = mask.expand(b, h, m, mask.shape[-1])                  # heads (and rows, for a 2-D mask) by stride 0
    try:
        cuda = torch.backends.cuda
        if not cuda.mem_efficient_sdp_enabled() or \
                not cuda.can_use_efficient_attention(cuda.SDPAParams(q, k, v, bias, 0.0, False, False)):
            return None
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, 0.0, False,
                                                                      scale=scale)[0]
    except Exception as e:  # noqa: BLE001 - e.g. another torch's signature: SDPA decides, visibly
        _efficient_failed.append(f"{type(e).__name__}: {e}")
        from shapeplan import diagnostics
        diagnostics.record("FALLBACK", "prefill attention: memory-efficient kernel unavailable, using SDPA",
                           reason=_efficient_failed[-1][:300])
        return None


# --------------------------------------------------------------------------------------------- sampling
def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2**32) (multipliers < 2**31, so
    products never overflow int64: identical results on every device)."""
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _M32
    h = h ^ (h >> 15)
    h = (h * 0x1B873593) & _M32
    return h ^ (h >> 16)


def uniform_noise(seed: torch.Tensor, position: torch.Tensor, n: int) -> torch.Tensor:
    """Counter-based uniforms in (0, 1): [B, n] from seed [B] and the step's position ([1], or [B]: one
    per row), reproducible across runs and devices and free of generator state (so it is capture-safe).
    A row's noise depends only on its own seed and position, never on the other rows of a batch."""
    dev = seed.device
    key = _mix32((seed.reshape(-1, 1).to(torch.int64) & _M32) ^ 0x5BD1E995)                # [B, 1]
    key = _mix32(key ^ (_row_starts(position, key.shape[0]) & _M32))
    idx = torch.arange(n, device=dev, dtype=torch.int64).reshape(1, n)
    h = _mix32(key ^ _mix32(idx + 0x27D4EB2F))                                               # [B, n]
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def _sample_shape(node):
    logits = node.inputs[0]
    b = logits.shape[0] if logits.shape is not None else None
    return [(as_dtype("int64"), (b, 1))]


@register("SampleToken", domain="shapeplan", shape=_sample_shape)
def sample_token(logits, params, seed, position, seen=None, adjust=None):
    """Pick the next token on the device.

    logits: [B, V]; params: float32 [B, 4 or 5] = (temperature, top_k, top_p, repetition_penalty[, min_p]) with
    temperature 0 = greedy, top_k <= 0 = off, top_p >= 1 = off, penalty 1 = off, min_p 0 = off; seed: int64 [B];
    position: int64 [1] or [B] (the sampling counter, per row in the batched engine); seen: optional [B, V] mask of tokens already in the
    context (for the repetition penalty); adjust: optional float32 [B, V] added to the logits after the
    repetition penalty (OpenAI's presence / frequency penalties and logit bias, kept per row by the serving
    core). Returns int64 [B, 1].

    Order as in transformers: repetition penalty, (the additive terms,) temperature, top-k, top-p, min-p (a
    token less likely than min_p x the likeliest left is dropped), then a draw. The draw is an exponential
    race (argmax of p / Exp(1)), which samples exactly from p."""
    x = logits.to(torch.float32)
    params = params.to(device=x.device, dtype=torch.float32)
    if seen is not None:
        pen = params[:, 3:4]
        x = torch.where(seen.to(torch.bool), torch.where(x > 0, x / pen, x * pen), x)
    if adjust is not None:
        x = x + adjust.to(torch.float32)
    greedy = x.argmax(-1, keepdim=True)                                         # [B, 1]
    temp = params[:, 0:1]
    x = x / torch.where(temp > 0, temp, torch.ones_like(temp))
    vals, order = x.sort(-1, descending=True)                                   # [B, V]
    ranks = torch.arange(x.shape[-1], device=x.device).reshape(1, -1)
    top_k = params[:, 1:2]
    keep = (top_k <= 0) | (ranks < top_k)
    vals = vals.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(vals, -1)
    before = probs.cumsum(-1) - probs                                           # mass ranked above
    keep = keep & ((before < params[:, 2:3]) | (ranks == 0))
    if params.shape[1] > 4:       # min-p: p_i < min_p * p_max, i.e. (sorted, so vals[:, :1] is the max) as logits
        keep = keep & (vals - vals[:, :1] >= torch.log(params[:, 4:5]))                # log 0 = -inf: all kept
    probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), -1)
    race = probs / -torch.log(uniform_noise(seed, position, x.shape[-1]))
    pick = order.gather(-1, race.argmax(-1, keepdim=True))                      # [B, 1]
    return torch.where(temp > 0, pick, greedy)


# ------------------------------------------------------------------------------------ paged KV cache
#: block 0 of every pool is never given to a sequence: the torch kernels send padding writes there
#: (no masked scatter, so no host sync), and unused block-table entries point at it
NULL_BLOCK = 0


def _paged_caches_shape(node):
    return [(v.dtype, v.shape) for v in node.inputs[:2]]


def _paged_slots(positions, lengths, block_tables, s: int, block_size: int):
    """Flat (block, offset) of every token of every row: [B*S] each; tokens past a row's length go to
    the null block (their writes are discarded)."""
    dev = positions.device
    i = torch.arange(s, device=dev)
    pos = positions.reshape(-1, 1).to(torch.int64) + i                            # [B, S]
    valid = i.reshape(1, -1) < lengths.reshape(-1, 1)
    col = (pos // block_size).clamp(0, block_tables.shape[1] - 1)
    blk = block_tables.to(torch.int64).gather(1, col)
    blk = torch.where(valid, blk, torch.full_like(blk, NULL_BLOCK))
    return blk.reshape(-1), (pos % block_size).reshape(-1)


@register("PagedCacheWrite", domain="shapeplan", traits=Trait.MUTATES_INPUT | Trait.VIEW, shape=_paged_caches_shape)
def paged_cache_write(k_pool, v_pool, k, v, positions, lengths, block_tables, cos=None, sin=None, *, interleaved: int = 0):
    """Write this step's keys and values into the paged pools, in place; returns ``(k_pool, v_pool)``.

    k_pool, v_pool: [NB, Hkv, BS, D] (block-major: one block of one head is BS*D contiguous values);
    k, v: [B, Hkv, S, D]; positions int64 [B]: the absolute position of row b's first token; lengths
    int64 [B]: how many of the row's S tokens are real (0: a padding row, which writes nothing);
    block_tables int32 [B, MAXB]: the row's blocks in order (position p lives in block
    ``block_tables[b, p // BS]`` at offset ``p % BS``). With ``cos``/``sin`` ([B, S, D/2], as
    RotaryEmbedding takes them) the keys are rotated first (RoPE), as in ``CacheWriteKV``.
    On CUDA one Triton kernel does the rotation and both writes; elsewhere torch (no host sync)."""
    kern = _paged_kernels() if k_pool.is_cuda else None
    if kern is not None:
        return kern.paged_cache_write(k_pool, v_pool, k, v, positions, lengths, block_tables, cos, sin,
                                      interleaved=interleaved)
    if cos is not None:
        from shapeplan.ops.transformer import rotary_embedding
        k = rotary_embedding(k, cos, sin, interleaved=interleaved)
    b, hkv, s, d = k.shape
    blk, off = _paged_slots(positions, lengths, block_tables, s, k_pool.shape[2])
    kk = k.permute(0, 2, 1, 3).reshape(b * s, hkv, d).to(k_pool.dtype)            # [B*S, Hkv, D]
    vv = v.permute(0, 2, 1, 3).reshape(b * s, hkv, d).to(v_pool.dtype)
    k_pool.permute(0, 2, 1, 3).index_put_((blk, off), kk)                          # view: [NB, BS, Hkv, D]
    v_pool.permute(0, 2, 1, 3).index_put_((blk, off), vv)
    return k_pool, v_pool


@register("PagedAttention", domain="shapeplan", shape=same_as(0))
def paged_attention(q, k_pool, v_pool, positions, lengths, block_tables, cos=None, sin=None, *, scale: float = 0.0,
                    window: int = 0, interleaved: int = 0):
    """Attention of each row's queries over that row's blocks of the paged pools; with ``cos``/``sin``
    ([B, S, D/2], as RotaryEmbedding takes them) the queries are rotated first (RoPE, ``interleaved``
    pairs or rotate-half), as ``RotaryEmbedding(q, cos, sin)`` would rotate them.

    q: [B, Hq, S, D]; pools [NB, Hkv, BS, D] already holding this step's keys; positions, lengths
    int64 [B], block_tables int32 [B, MAXB] as in ``PagedCacheWrite``. Query i of row b (absolute
    position ``positions[b] + i``) sees the row's keys at positions ``<= positions[b] + i`` (and
    ``> positions[b] + i - window`` with a sliding window). Rows with ``lengths[b] == 0`` (padding)
    give zeros. Grouped-query attention folds the G = Hq / Hkv heads of a group into the query rows.

    On CUDA a decode step (S = 1) runs a Triton split-K kernel that reads only the row's live blocks
    (and merges the splits in its last program);
    elsewhere (and for prefill) the row's blocks are gathered and SDPA runs over them with the causal
    mask: every row is computed on its own, so a row's result does not depend on the other rows. A CUDA
    prefill takes SDPA's memory-efficient kernel directly where its score matrix is small, as
    ``CachedAttention`` does (``_efficient_attention``: no cuDNN graph built per thread and shape)."""
    b, hq, s, d = q.shape
    kern = _paged_kernels() if q.is_cuda else None
    if s == 1 and kern is not None:
        return kern.paged_decode_attention(q, k_pool, v_pool, positions, lengths, block_tables,
                                           scale=scale or d ** -0.5, window=window, cos=cos, sin=sin,
                                           interleaved=interleaved)
    if cos is not None:
        q = _rotate(q, cos, sin, interleaved)
    nb, hkv, bs, _ = k_pool.shape
    maxb = block_tables.shape[1]
    if not q.is_cuda:                  # on the host a read is free: gather only the blocks some row uses
        maxb = max(1, min(maxb, -(-int((positions.reshape(-1) + s).max()) // bs)))
    bt = block_tables[:, :maxb].to(torch.int64).clamp(0, nb - 1)
    kk = k_pool[bt].permute(0, 2, 1, 3, 4).reshape(b, hkv, maxb * bs, d).to(q.dtype)   # [B, Hkv, L, D]
    vv = v_pool[bt].permute(0, 2, 1, 3, 4).reshape(b, hkv, maxb * bs, d).to(q.dtype)
    qpos = positions.reshape(-1, 1).to(torch.int64) + torch.arange(s, device=q.device)  # [B, S]
    kpos = torch.arange(maxb * bs, device=q.device)
    mask = kpos.reshape(1, 1, -1) <= qpos.unsqueeze(-1)                             # [B, S, L]
    if window:
        mask = mask & (kpos.reshape(1, 1, -1) > qpos.unsqueeze(-1) - window)
    g = hq // hkv
    mask = mask.unsqueeze(1).repeat(1, 1, g, 1).reshape(b, 1, g * s, -1) if g > 1 else mask.unsqueeze(1)
    qg = q.reshape(b, hkv, g * s, d)                                                 # [B, Hkv, G*S, D]
    bias = torch.zeros((), dtype=q.dtype, device=q.device).where(mask, torch.full((), float("-inf"), dtype=q.dtype,
                                                                                   device=q.device))
    out = _efficient_attention(qg, kk, vv, bias, scale or d ** -0.5)                  # as CachedAttention
    if out is None:
        out = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=bias, scale=scale or None)
    out = out.reshape(b, hq, s, d)
    live = (lengths.reshape(-1, 1, 1, 1) > 0)
    return torch.where(live, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _paged_write_attention_shape(node):
    q = node.inputs[0]
    out = [(q.dtype, q.shape)]
    if not node.attrs.get("x_codes"):
        return out
    from shapeplan.errors import ShapeError
    from shapeplan.quant.quantize import x_code_words
    hq, d = (None, None) if q.shape is None else (q.shape[1], q.shape[3])
    if isinstance(d, int) and d % 32:
        raise ShapeError(f"node {node.describe()}: x_codes needs a head size that is a multiple of 32, "
                         f"input {q.name!r} has {d}")
    words = x_code_words(hq * d) if isinstance(hq, int) and isinstance(d, int) else None
    return out + [(as_dtype("int32"), None if words is None else (words,))]


@register("PagedWriteAttention", domain="shapeplan", traits=Trait.MUTATES_INPUT, shape=_paged_write_attention_shape)
def paged_write_attention(q, k, v, k_pool, v_pool, positions, lengths, block_tables, counters, cos=None, sin=None, *,
                          scale: float = 0.0, window: int = 0, interleaved: int = 0, x_codes: int = 0):
    """``PagedCacheWrite(k_pool, v_pool, k, v, ...)`` then ``PagedAttention(q, ...)`` as one op (the paged
    LLM graph's attention): writes this step's keys (rotated) and values into the pools in place and
    returns the attention of ``q`` (rotated too) over them, [B, Hq, S, D].

    ``cos``/``sin``: the rotary tables [L, D/2] (row p: position p); token i of row b is rotated by row
    ``positions[b] + i`` (so the graph gathers no per-step cos/sin). ``counters``: int32 [>= B * Hkv],
    zeros (a state variable of the graph), which the CUDA decode kernel uses to let the last program
    of each (row, head) merge the splits, and leaves zero. On CUDA a decode step (S = 1) is that one
    Triton kernel (the write, the split-K attention and the merge); a prefill, and every step
    elsewhere, runs the two ops' kernels in turn. The pools end exactly as ``PagedCacheWrite`` leaves
    them.

    ``x_codes=1`` (head size a multiple of 32): a second output, int32 [Hq * D / 4 + Hq * D / 16], the
    first token of row 0 (the whole step at batch 1 and decode) flattened as the o projection's x, as int8
    codes per block of 32 (``shapeplan.quant.quantize.x_codes``), for QuantMatMulAdd's one-row kernel; in
    a CUDA decode step the attention kernel's merges write them (no x quantizer launch)."""
    s = q.shape[2]
    if s == 1 and q.is_cuda:
        kern = _paged_kernels()
        if kern is not None:
            return kern.paged_decode_attention(q, k_pool, v_pool, positions, lengths, block_tables,
                                               scale=scale or q.shape[-1] ** -0.5, window=window, cos=cos, sin=sin,
                                               interleaved=interleaved, k=k, v=v, counters=counters,
                                               rope_table=True, x_codes=bool(x_codes))
    if cos is not None:                # the rows of this step's positions: [B, S, D/2]
        pos = positions.reshape(-1, 1).to(torch.int64) + torch.arange(s, device=positions.device)
        cos, sin = cos[pos], sin[pos]
    paged_cache_write(k_pool, v_pool, k, v, positions, lengths, block_tables, cos, sin, interleaved=interleaved)
    out = paged_attention(q, k_pool, v_pool, positions, lengths, block_tables, cos, sin, scale=scale,
                          window=window, interleaved=interleaved)
    if not x_codes:
        return out
    from shapeplan.ops.quantized import quant_x_codes
    return out, quant_x_codes(out[0, :, 0, :].reshape(1, -1))


def _last_token_shape(node):
    h = node.inputs[0]
    return [(h.dtype, None if h.shape is None else (h.shape[0], 1) + tuple(h.shape[2:]))]


@register("LastToken", domain="shapeplan", traits=Trait.VIEW, shape=_last_token_shape)
def last_token(h, lengths):
    """Each row's last valid token: h [B, S, ...], lengths int64 [B] (valid tokens of the row; 0 for a
    padding row, which gets token 0) -> [B, 1, ...], row b = ``h[b, max(lengths[b] - 1, 0)]``. A decode
    step (S = 1) returns ``h`` itself (a view: no kernel)."""
    if h.shape[1] == 1:
        return h
    idx = (lengths.reshape(-1, 1).to(torch.int64) - 1).clamp(min=0)                 # [B, 1]
    idx = idx.reshape(idx.shape + (1,) * (h.dim() - 2)).expand(h.shape[0], 1, *h.shape[2:])
    return h.gather(1, idx)


def _embedding_shape(node):
    table, ids = node.inputs
    if table.shape is None or ids.shape is None:
        return [(table.dtype, None)]
    return [(table.dtype, tuple(ids.shape) + tuple(table.shape[1:]))]


@register("Embedding", domain="shapeplan", shape=_embedding_shape)
def embedding(table, ids):
    """``table[ids]``: table [V, H], ids int64 in [0, V) -> [..., H]. ONNX's Gather on axis 0 without its
    negative indices (a token id is never negative): one kernel where Gather's wrap costs three more on
    CUDA. An id outside [0, V) raises IndexError on the host (on CUDA: the device's index check)."""
    return F.embedding(ids, table)


def _rotate(q, cos, sin, interleaved: int):
    """RotaryEmbedding(q [B, H, S, D], cos, sin [B, S, D/2]): the Triton row kernel on CUDA (what the
    triton backend runs for RotaryEmbedding), else the op's torch kernel."""
    if q.is_cuda and _paged_kernels() is not None:
        try:
            from shapeplan.runtime.backends.triton.kernels import rows
            return rows.rope(q, cos.unsqueeze(1), sin.unsqueeze(1), bool(interleaved))
        except ImportError:
            pass
    from shapeplan.ops.transformer import rotary_embedding
    return rotary_embedding(q, cos, sin, interleaved=interleaved)


_paged_kernel_state: list = []


def _paged_kernels():
    """The Triton paged kernels (shapeplan/runtime/backends/triton/kernels/paged.py), or None when Triton
    cannot run them here (then the torch kernels above run, visibly: a FALLBACK event)."""
    return triton_kernels(_paged_kernel_state, "paged", "paged KV ops")


# ------------------------------------------------------------------------------- structured output
def _bitmask_keep(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, W] int32 words -> [B, V] int32, nonzero where bit ``v % 32`` of word ``v // 32`` is set
    (xgrammar's layout)."""
    bits = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32, device=bitmask.device)
    return (bitmask.to(torch.int32).unsqueeze(-1) & bits).reshape(bitmask.shape[0], -1)[:, :vocab]


@register("ApplyTokenBitmask", domain="shapeplan", shape=same_as(0))
def apply_token_bitmask(logits, bitmask):
    """Mask out the tokens a grammar forbids: ``logits`` [B, V] with every token whose bit is 0 in
    ``bitmask`` (int32 [B, ceil(V / 32)], xgrammar's layout: token v is bit ``v % 32`` of word
    ``v // 32``) set to -inf; returns a new tensor. A row of all ones (-1 words) passes unchanged, so
    rows without a constraint share the call. On CUDA one Triton kernel
    (shapeplan/runtime/backends/triton/kernels/bitmask.py); elsewhere torch, on the rows that forbid
    anything (on the host a read is free)."""
    kern = _bitmask_kernel() if logits.is_cuda else None
    if kern is not None:
        return kern.apply_token_bitmask(logits, bitmask)
    neg = torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device)
    if logits.is_cuda:                                          # no host read: capturable
        return torch.where(_bitmask_keep(bitmask, logits.shape[-1]) != 0, logits, neg)
    out = logits.clone()
    rows = (bitmask != -1).any(1).nonzero().flatten()
    if rows.numel():
        out[rows] = torch.where(_bitmask_keep(bitmask[rows], logits.shape[-1]) != 0, logits[rows], neg)
    return out


_bitmask_kernel_state: list = []


def _bitmask_kernel():
    """The Triton bitmask kernel, or None when Triton cannot run it here (a FALLBACK event says why)."""
    return triton_kernels(_bitmask_kernel_state, "bitmask", "ApplyTokenBitmask")
