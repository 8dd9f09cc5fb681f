"""Attention ops: ONNX Attention (23, 24, 25), LinearAttention (27), ai.onnx.preview FlexAttention,
and ``shapeplan::Attention`` (since=1, the ONNX semantics; emitted by the LLM builder and fusions).

Attention semantics (ONNX spec + its reference evaluator, which generates the conformance data):

* Q/K/V are 4D ``[B, H, S, D]``, or 3D ``[B, S, H*D]`` with ``q_num_heads``/``kv_num_heads``.
* ``past_key``/``past_value`` ``[B, Hkv, P, D]`` are concatenated in front of K/V along the
  sequence axis; ``present_key``/``present_value`` are the concatenations.
* GQA: K/V heads are repeated interleaved (``[h0, h0, h1, h1, ...]``) to the query head count.
* The additive bias combines ``attn_mask`` (bool: False -> -inf; float: added; padded with
  False / -inf up to the total kv length), a bottom-right causal frontier (query i attends key j
  iff ``j <= i + offset``, offset = past length, or ``nonpad_kv_seqlen[b] - q_len`` for an
  external cache), the opset-25 sliding window, and the ``nonpad_kv_seqlen`` key padding.
* scores = (Q*sqrt(scale)) @ (K*sqrt(scale))^T, softcapped (``c*tanh(s/c)``) before the bias.
* A query row whose bias is -inf everywhere produces zeros (Y and mode-3 output), never NaN.
* qk_matmul_output (4th output): mode 0 raw QK, 1 after softcap, 2 after softcap + bias,
  3 after softmax.

The math is done in the input precision (as the spec says) unless ``softmax_precision`` asks for
more. The fast path is ``torch.nn.functional.scaled_dot_product_attention`` when nothing needs the
explicit score matrix (no softcap, no 4th output, no softmax_precision); on CPU it is taken only
for float32/float64 inputs so half-precision results follow the spec's step-by-step rounding.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import DType
from shapeplan.ir.graph import Shape
from shapeplan.ops.registry import register
from shapeplan.ops.transformer import dim_add, dim_div, dim_mul

_ONNX_FLOAT = {1: torch.float32, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}


# ----------------------------------------------------------------- layout helpers


def _to_4d(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """[B, S, H*D] -> [B, H, S, D]."""
    b, s, hidden = x.shape
    if hidden % heads:
        raise ValueError(f"Attention: {what} hidden size {hidden} is not divisible by {heads} heads")
    return x.reshape(b, s, heads, hidden // heads).transpose(1, 2)


def _repeat_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def _neg_inf_where(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), float("-inf"), dtype=dtype, device=allowed.device))


def _build_bias(attn_mask: torch.Tensor | None, nonpad: torch.Tensor | None, *, q_len: int,
                kv_len: int, past_len: int | None, is_causal: bool, left: int, right: int,
                dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The additive attention bias (0 / -inf / float mask), broadcastable to [B, H, q, kv];
    None when nothing masks."""
    bias: torch.Tensor | None = None
    if attn_mask is not None:
        pad = kv_len - attn_mask.shape[-1]
        if attn_mask.dtype == torch.bool:
            if pad > 0:
                attn_mask = F.pad(attn_mask, (0, pad), value=False)
            bias = _neg_inf_where(attn_mask, dtype)
        else:
            bias = attn_mask.to(dtype)
            if pad > 0:
                bias = F.pad(bias, (0, pad), value=float("-inf"))
    windowed = left >= 0 or right >= 0
    if is_causal or windowed:
        i = torch.arange(q_len, device=device).reshape(q_len, 1)
        j = torch.arange(kv_len, device=device).reshape(1, kv_len)
        if past_len is None and nonpad is not None:                # external cache: per batch
            offset = (nonpad.reshape(-1).to(device=device, dtype=torch.int64) - q_len).reshape(-1, 1, 1, 1)
        else:
            offset = past_len or 0
        diff = (i + offset) - j                                    # [q, kv] or [B, 1, q, kv]
        allowed = torch.ones_like(diff, dtype=torch.bool)
        if is_causal:
            allowed = allowed & (diff >= 0)
        if left >= 0:
            allowed = allowed & (diff <= left)
        if right >= 0:
            allowed = allowed & (-diff <= right)
        frontier = _neg_inf_where(allowed, dtype)
        bias = frontier if bias is None else bias + frontier
    if nonpad is not None:
        keep = torch.arange(kv_len, device=device).reshape(1, kv_len) < \
            nonpad.reshape(-1, 1).to(device=device, dtype=torch.int64)
        padding = _neg_inf_where(keep, dtype).reshape(-1, 1, 1, kv_len)
        bias = padding if bias is None else bias + padding
    return bias


def _rounded_sqrt(scale: float, dtype: torch.dtype) -> float:
    """sqrt(scale) rounded to ``dtype`` (as the spec casts it), as a Python float: no host-to-device
    copy, so the kernel stays capturable in a CUDA graph."""
    return float(torch.tensor(math.sqrt(scale), dtype=torch.float32).to(dtype))


def _softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, step by step in x's dtype; an all -inf row gives zeros."""
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


# ----------------------------------------------------------------- Attention kernel


def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
              scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1,
              right_window_size=-1, _n_out=1):
    """ONNX Attention -> (Y, present_key, present_value, qk_matmul_output)[:n_out]."""
    if q.dim() != k.dim() or q.dim() != v.dim() or q.dim() not in (3, 4):
        raise ValueError(f"Attention: Q, K, V must all be 3D or all 4D, got ranks "
                         f"{q.dim()}, {k.dim()}, {v.dim()}")
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise ValueError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    in_3d = q.dim() == 3
    if in_3d:
        if not q_num_heads or not kv_num_heads:
            raise ValueError("Attention: 3D Q/K/V need the q_num_heads and kv_num_heads attributes")
        q, k, v = _to_4d(q, q_num_heads, "Q"), _to_4d(k, kv_num_heads, "K"), _to_4d(v, kv_num_heads, "V")
    b, hq, q_len, head = q.shape                                  # q: [B, Hq, Sq, D]
    if past_key is not None:
        k = torch.cat((past_key, k), dim=2)                         # [B, Hkv, P+Skv, D]
        v = torch.cat((past_value, v), dim=2)
    present_k, present_v = k, v
    hkv, kv_len = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ValueError(f"Attention: {hq} query heads are not a multiple of {hkv} key/value heads")
    rep = hq // hkv
    scale = 1.0 / math.sqrt(head) if scale is None else float(scale)
    want_qk = _n_out >= 4
    sm_dtype = _ONNX_FLOAT.get(softmax_precision, q.dtype) if softmax_precision is not None else q.dtype
    if sm_dtype.itemsize < q.dtype.itemsize:
        sm_dtype = q.dtype
    fast = (not want_qk and not softcap and sm_dtype == q.dtype
            and (q.is_cuda or q.dtype in (torch.float32, torch.float64)))
    # plain top-left causal (no cache, mask or window): SDPA's own is_causal, no bias tensor
    plain_causal = (bool(is_causal) and attn_mask is None and nonpad_kv_seqlen is None
                    and past_key is None and left_window_size < 0 and right_window_size < 0)
    bias = None
    if not (fast and plain_causal):
        bias = _build_bias(attn_mask, nonpad_kv_seqlen, q_len=q_len, kv_len=kv_len,
                           past_len=None if past_key is None else past_key.shape[2],
                           is_causal=bool(is_causal), left=left_window_size,
                           right=right_window_size, dtype=q.dtype, device=q.device)
    row_masked = None if bias is None else torch.isneginf(bias.amax(dim=-1, keepdim=True))

    if fast:
        y = F.scaled_dot_product_attention(q, _repeat_kv(k, rep), _repeat_kv(v, rep),
                                           attn_mask=bias, is_causal=plain_causal, scale=scale)
        if row_masked is not None:
            y = torch.where(row_masked, torch.zeros((), dtype=y.dtype, device=y.device), y)
        qk = None
    else:
        s = _rounded_sqrt(scale, q.dtype)
        scores = (q * s) @ (_repeat_kv(k, rep) * s).transpose(-1, -2)   # [B, Hq, Sq, Skv]
        qk = scores
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
            if qk_matmul_output_mode == 1:
                qk = scores
        if bias is not None:
            scores = scores + bias
        if qk_matmul_output_mode == 2:
            qk = scores
        probs = _softmax_rows(scores.to(sm_dtype))
        if row_masked is not None:
            probs = torch.where(row_masked, torch.zeros((), dtype=probs.dtype, device=probs.device), probs)
        if qk_matmul_output_mode == 3:
            qk = probs
        y = probs.to(q.dtype) @ _repeat_kv(v, rep).to(q.dtype)       # [B, Hq, Sq, Dv]
    if in_3d:
        y = y.transpose(1, 2).reshape(b, q_len, -1)                  # [B, Sq, Hq*Dv]
    if _n_out == 1:
        return y
    outs = (y, present_k, present_v, None if qk is None else qk.to(q.dtype))
    return outs[:_n_out]


def _attention_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    ins = list(node.inputs) + [None] * (7 - len(node.inputs))
    q, k, v, _, past_k, _, _ = ins
    dt = q.dtype
    a = node.attrs
    n_out = len(node.outputs)
    unknown = [(dt, None)] * n_out
    if q.shape is None or k.shape is None or v.shape is None:
        return unknown
    if not len(q.shape) == len(k.shape) == len(v.shape) or len(q.shape) not in (3, 4):
        raise ShapeError(f"node {node.describe()}: Q, K, V must all be 3D or all 4D, got shapes "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if len(q.shape) == 3:
        hq, hkv = a.get("q_num_heads"), a.get("kv_num_heads")
        if not hq or not hkv:
            raise ShapeError(f"node {node.describe()}: 3D Q/K/V need q_num_heads and kv_num_heads")
        batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
        head_k, head_v = dim_div(k.shape[2], hkv), dim_div(v.shape[2], hkv)
        y = (batch, q_len, dim_mul(hq, head_v))
    else:
        batch, hq, q_len, _ = q.shape
        hkv, kv_len, head_k, head_v = k.shape[1], k.shape[2], k.shape[3], v.shape[3]
        y = (batch, hq, q_len, head_v)
    if past_k is not None:
        total = None if past_k.shape is None else dim_add(past_k.shape[2], kv_len)
    else:
        total = kv_len
    return [(dt, y), (dt, (batch, hkv, total, head_k)), (dt, (batch, hkv, total, head_v)),
            (dt, (batch, hq, q_len, total))][:n_out]


# One kernel; the opset 23 and 24 entries only narrow the schema (no window attributes before 25,
# no nonpad_kv_seqlen input before 24), so a model using a later feature under an older opset is
# rejected at bind time with the attribute / input named.
@register("Attention", since=23, shape=_attention_shape)
def attention_23(q, k, v, attn_mask=None, past_key=None, past_value=None, *, is_causal=0,
                 kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
                 softcap=0.0, softmax_precision=None, _n_out=1):
    """ONNX Attention-23 (see ``attention``)."""
    return attention(q, k, v, attn_mask, past_key, past_value, None, is_causal=is_causal,
                     kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                     qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                     softmax_precision=softmax_precision, _n_out=_n_out)


@register("Attention", since=24, shape=_attention_shape)
def attention_24(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
                 is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
                 scale=None, softcap=0.0, softmax_precision=None, _n_out=1):
    """ONNX Attention-24: adds the nonpad_kv_seqlen input (see ``attention``)."""
    return attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                     kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                     qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                     softmax_precision=softmax_precision, _n_out=_n_out)


register("Attention", since=25, shape=_attention_shape)(attention)
register("Attention", domain="shapeplan", since=1, shape=_attention_shape)(attention)


# ----------------------------------------------------------------- LinearAttention (opset 27)

_LINEAR_RULES = ("linear", "gated", "delta", "gated_delta")


def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                     kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
    """Recurrent linear attention over 3D [B, T, H*D] inputs -> (output, present_state).

    Per step t (state S: [B, Hkv, Dk, Dv], float32):  S *= exp(decay_t) (gated rules);
    v_t <- beta_t * (v_t - S^T k_t) (delta rules); S += k_t v_t^T; o_t = scale * q_t S
    (S repeated interleaved over the query heads of its group). chunk_size is a tuning hint.
    """
    del chunk_size
    if update_rule not in _LINEAR_RULES:
        raise ValueError(f"LinearAttention: update_rule {update_rule!r} is not one of {_LINEAR_RULES}")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise ValueError(f"LinearAttention: q_num_heads ({q_num_heads}) must be a positive multiple "
                         f"of kv_num_heads ({kv_num_heads})")
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        raise ValueError(f"LinearAttention: update_rule {update_rule!r} "
                         f"{'requires' if gated else 'forbids'} the decay input")
    if delta != (beta is not None):
        raise ValueError(f"LinearAttention: update_rule {update_rule!r} "
                         f"{'requires' if delta else 'forbids'} the beta input")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 3:
            raise ValueError(f"LinearAttention: {name} must be rank 3 [B, T, H*D], got {list(t.shape)}")
    f32 = torch.float32
    b, steps, _ = query.shape
    q = _to_4d(query, q_num_heads, "query").to(f32)              # [B, Hq, T, Dk]
    k = _to_4d(key, kv_num_heads, "key").to(f32)                 # [B, Hkv, T, Dk]
    v = _to_4d(value, kv_num_heads, "value").to(f32)             # [B, Hkv, T, Dv]
    dk, dv = k.shape[-1], v.shape[-1]
    if decay is not None:
        if decay.shape[-1] == kv_num_heads:                       # per head: [B, Hkv, T, 1]
            g = decay.reshape(b, steps, kv_num_heads, 1).transpose(1, 2).to(f32)
        elif decay.shape[-1] == kv_num_heads * dk:               # per key dim: [B, Hkv, T, Dk]
            g = _to_4d(decay, kv_num_heads, "decay").to(f32)
        else:
            raise ValueError(f"LinearAttention: decay last dim {decay.shape[-1]} must be kv_num_heads "
                             f"({kv_num_heads}) or kv_num_heads*d_k ({kv_num_heads * dk})")
        g = g.exp()
    if beta is not None:
        if beta.shape[-1] not in (kv_num_heads, 1):
            raise ValueError(f"LinearAttention: beta last dim {beta.shape[-1]} must be kv_num_heads "
                             f"({kv_num_heads}) or 1")
        bt = beta.reshape(b, steps, beta.shape[-1], 1).transpose(1, 2).to(f32)   # [B, H|1, T, 1]
    if past_state is not None:
        if tuple(past_state.shape) != (b, kv_num_heads, dk, dv):
            raise ValueError(f"LinearAttention: past_state shape {list(past_state.shape)} must be "
                             f"{[b, kv_num_heads, dk, dv]}")
        state, state_dtype = past_state.to(f32), past_state.dtype
    else:
        state, state_dtype = torch.zeros((b, kv_num_heads, dk, dv), dtype=f32, device=query.device), query.dtype
    scale = float(scale) if scale else 1.0 / math.sqrt(dk)
    rep = q_num_heads // kv_num_heads
    outs = []
    for t in range(steps):
        k_t, v_t = k[:, :, t], v[:, :, t]                         # [B, Hkv, Dk], [B, Hkv, Dv]
        if gated:
            state = state * g[:, :, t].unsqueeze(-1)
        if delta:
            v_t = bt[:, :, t] * (v_t - torch.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        outs.append(scale * torch.einsum("bhd,bhdm->bhm", q[:, :, t], _repeat_kv(state, rep)))
    out = torch.stack(outs, dim=2) if outs else q.new_zeros((b, q_num_heads, 0, dv))  # [B, Hq, T, Dv]
    out = out.transpose(1, 2).reshape(b, steps, q_num_heads * dv).to(query.dtype)
    return out, state.to(state_dtype)


def _linear_attention_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    q, k, v = node.inputs[:3]
    past = node.inputs[3] if len(node.inputs) > 3 else None
    hq, hkv = node.attrs.get("q_num_heads"), node.attrs.get("kv_num_heads")
    if q.shape is None or k.shape is None or v.shape is None or not hq or not hkv:
        return [(q.dtype, None), (past.dtype if past is not None else q.dtype, None)]
    dk, dv = dim_div(k.shape[2], hkv), dim_div(v.shape[2], hkv)
    return [(q.dtype, (q.shape[0], q.shape[1], dim_mul(hq, dv))),
            (past.dtype if past is not None else q.dtype, (q.shape[0], hkv, dk, dv))]


register("LinearAttention", since=27, shape=_linear_attention_shape)(linear_attention)


# ----------------------------------------------------------------- FlexAttention (ai.onnx.preview)


def _flex_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    q, _, v = node.inputs[:3]
    if q.shape is None or v.shape is None:
        return [(q.dtype, None)]
    return [(q.dtype, tuple(q.shape[:3]) + (v.shape[3],))]


def _bind_flex(node: Any, opset: int):
    """FlexAttention: scores = (Q*sqrt(s)) @ (K*sqrt(s))^T in the input type, then in the softmax
    precision (float32 for half inputs): score_mod subgraph, softmax, prob_mod subgraph, @ V."""
    from shapeplan.ops.control import Body
    outer = [v.name for v in node.implicit_inputs]
    score_mod = Body(node.attrs["score_mod"], outer, node) if "score_mod" in node.attrs else None
    prob_mod = Body(node.attrs["prob_mod"], outer, node) if "prob_mod" in node.attrs else None
    scale = node.attrs.get("scale")
    precision = node.attrs.get("softmax_precision")
    unknown = set(node.attrs) - {"score_mod", "prob_mod", "scale", "softmax_precision"}
    if unknown:
        raise ValueError(f"node {node.describe()}: FlexAttention has no attribute(s) {sorted(unknown)}")

    def call(q, k, v, *implicit):
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(f"FlexAttention needs rank-4 Q, K, V, got {list(q.shape)}, "
                             f"{list(k.shape)}, {list(v.shape)}")
        hq, hkv = q.shape[1], k.shape[1]
        if hq % hkv:
            raise ValueError(f"FlexAttention: {hq} query heads are not a multiple of {hkv} kv heads")
        s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        root = _rounded_sqrt(s, q.dtype)
        scores = (q * root) @ (_repeat_kv(k, hq // hkv) * root).transpose(-1, -2)
        cdt = _ONNX_FLOAT[precision] if precision is not None else \
            (torch.float32 if q.dtype.itemsize < 4 else q.dtype)
        scores = scores.to(cdt)
        if score_mod is not None:
            scores = score_mod.run([scores], implicit, q.device)[0].to(cdt)
        probs = torch.softmax(scores, dim=-1)
        if prob_mod is not None:
            probs = prob_mod.run([probs], implicit, q.device)[0].to(cdt)
        return ((probs @ _repeat_kv(v, hq // hkv).to(cdt)).to(v.dtype),)

    return call


def _flex_unbound(*_: Any, **__: Any) -> Any:
    raise RuntimeError("FlexAttention runs through its bind hook")


register("FlexAttention", domain="ai.onnx.preview", since=1, shape=_flex_shape,
         bind=_bind_flex)(_flex_unbound)
