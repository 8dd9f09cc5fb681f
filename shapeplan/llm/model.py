"""Build a Llama-family decoder as a shapeplan Graph (builder API).

One graph serves prefill and decode: the sequence axis is symbolic, so the engine makes one plan per
prefill bucket and one for decode (seq = 1). Inputs and outputs::

    input_ids   int64 [B, S]   tokens of this step (prefill: padded to a bucket; decode: S = 1)
    position    int64 [1]      absolute position of input_ids[:, 0]   (device-resident)
    length      int64 [1]      valid tokens in input_ids (<= S; the rest is padding)

    logits             [B, V]      at the last valid position only (the LM head runs on one row)
    next_token         int64 [B,1] greedy pick (ArgMax)
    next_token_sampled int64 [B,1] sampled pick (shapeplan::SampleToken, settings in variables)
    next_position      int64 [1]   position + length: feed it back for the next step
    all_logits         [B, S, V]   every position (requested only by tests / scoring)
    next_token_logprob / next_token_sampled_logprob   float32 [B, 1]   log-softmax of ``logits`` at the pick
    top_logprobs       float32 [B, K]  the K = min(TOP_LOGPROBS, V) largest log-probabilities, descending
    top_token_ids      int64 [B, K]    ... and their token ids (requested only for requests that want logprobs)

Variables (persist in the Engine): ``k_cache_{i}``, ``v_cache_{i}`` [B, Hkv, L, D] written in place by
``shapeplan::CacheWriteKV`` (both of a layer's writes) at ``position``; ``sampling_params`` float32 [B, 5],
``sampling_seed`` int64 [B], ``seen_tokens`` bool [B, V] (repetition penalty), ``logit_adjust`` float32 [B, V]
(added to the logits before sampling: presence / frequency penalties, logit bias).

With ``paged=PagedKV(...)`` (the batched engine, shapeplan/llm/batch) every row has its own position
and its own blocks of a shared pool; the inputs become::

    input_ids     int64 [B, S]      row b's tokens (decode: S = 1; padding rows and tokens are ignored)
    positions     int64 [B]         absolute position of input_ids[b, 0]
    lengths       int64 [B]         valid tokens of row b (0: a padding row, which writes nothing)
    block_tables  int32 [B, MAXB]   row b's blocks in order (position p: block p // BS, offset p % BS)
    state_slots   int64 [B]         row b's row of the sampling-state variables

and ``next_position`` is [B] (positions + lengths). The caches are pools ``[NB, Hkv, BS, D]`` written by
``shapeplan::PagedWriteAttention`` (which rotates k and q, writes k and v, and attends: no RotaryEmbedding
node in a paged graph, and one kernel per decode step on CUDA; its int32 variables ``attention.counters_{i}``
hold the kernel's per-(row, head) counters); the sampling variables have ``state_slots`` rows,
gathered per step by ``state_slots``. Where a quantized o projection reads x as int8 codes on CUDA
(``attention_x_codes``), PagedWriteAttention has a second output, o's x as those codes (its kernel
writes them: no x quantizer before o), which QuantMatMulAdd takes as its fourth input.

With ``fuse_norms`` a decoder block is RMSNormMatMul (input norm + q/k/v), MatMulAdd (o_proj + residual),
RMSNormMatMul with the SiLU gate (post-attention norm + gate/up), MatMulAdd (down_proj + residual); the
final norm and the LM head are one more RMSNormMatMul (shapeplan/ops/fused_linear.py, docs/gpu.md).

Weights enter as constants that *view* the checkpoint tensors: a projection is ``MatMul(x, W.T)``
with ``W.T`` a transposed view, so loading copies nothing. The q/k/v and gate/up projections are
emitted fused (``fuse_projections``): one MatMul over a row-stacked weight, then a Split. The stacked
tensor is the only copy: the caller's ``weights`` entries are rebound to row views of it, so the
unfused originals are freed (memory beyond the weights stays the KV cache plus plan buffers).
A quantized weight (``shapeplan.quant.QuantWeight``: a GGUF file's blocks, or ``quantize=`` at load) is a
uint8 constant of its packed bytes read by ``shapeplan::QuantMatMul`` (the embedding lookup: ``QuantGather``).
The residual add before each norm inside the stack is ``shapeplan::SkipRMSNormalization`` (add +
norm: one kernel on the triton backend, bit-identical to Add + RMSNormalization in torch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from shapeplan.ir.dtypes import dtype_name
from shapeplan.ir.graph import Graph, Value
from shapeplan.llm.config import LlamaConfig, rope_tables
from shapeplan.ops.registry import is_supported
from shapeplan.quant.formats import QuantWeight

SP = "shapeplan"
TOP_LOGPROBS = 20          # the ``top_logprobs`` output's width (OpenAI's API allows at most 20)


def _already_stacked(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor | None:
    """The stacked tensor when ``parts`` are consecutive row blocks of one buffer in ``dtype`` (a view
    of it, nothing copied); None otherwise."""
    first = parts[0]
    offset = first.storage_offset()
    for p in parts:
        if (p.dtype != dtype or not p.is_contiguous() or p.device != first.device or p.shape[1:] != first.shape[1:]
                or p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or p.storage_offset() != offset):
            return None
        offset += p.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _prefetch(on: bool) -> dict:
    """The fused linear ops' ``prefetch`` attribute (the GEMV's weight prefetch, kernels/gemv.py), or none."""
    return {"prefetch": 1} if on else {}


class _Builder:
    def __init__(self, g: Graph, cfg: LlamaConfig, w: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.g, self.cfg, self.w, self.dtype = g, cfg, w, dtype
        self.has_silu_mul = is_supported("SiluMul", SP)
        self._consts: dict[tuple[str, bool], Value] = {}

    def const(self, name: str, transpose: bool = False) -> Value:
        v = self._consts.get((name, transpose))
        if v is None:
            t = self.w[name]
            if t.dtype != self.dtype:
                t = t.to(self.dtype)
            v = self.g.constant(t.t() if transpose else t, name=name + (".T" if transpose else ""))
            self._consts[(name, transpose)] = v
        return v

    def stacked(self, names: list[str], fused_name: str, transpose: bool = False) -> Value:
        """One constant from the tensors ``names`` stacked along dim 0 (output rows). Where the
        originals already have the model dtype, ``self.w``'s entries become views of the stacked
        tensor, so the originals are dropped and the weights are held once."""
        v = self._consts.get((fused_name, transpose))
        if v is not None:
            return v
        parts = [self.w[n] for n in names]
        t = _already_stacked(parts, self.dtype)           # loaded into one buffer (weights.stacked_slots)
        if t is None:
            t = torch.cat([p.to(self.dtype) for p in parts], dim=0)               # [sum N_i, K]
        if all(p.dtype == self.dtype and p.device == t.device for p in parts):
            row = 0
            for n, p in zip(names, parts):
                self.w[n] = t[row:row + p.shape[0]]
                row += p.shape[0]
        del parts
        v = self.g.constant(t.t() if transpose else t, name=fused_name + (".T" if transpose else ""))
        self._consts[(fused_name, transpose)] = v
        return v

    def packed(self, name: str) -> Value:
        """The packed bytes of the quantized weight ``name`` as one constant (shared by every reader:
        a tied LM head reads the embedding's)."""
        v = self._consts.get((name, "packed"))
        if v is None:
            v = self._consts[(name, "packed")] = self.g.constant(self.w[name].packed, name=name + ".packed")
        return v

    def stacked_packed(self, names: list[str], fused_name: str) -> Value:
        """One packed constant of the quantized weights ``names`` (one qtype) stacked by rows; ``self.w``'s
        entries become row views of it, as in ``stacked``."""
        v = self._consts.get((fused_name, "packed"))
        if v is None:
            parts = [self.w[n] for n in names]
            t = _already_stacked([p.packed for p in parts], torch.uint8)
            if t is None:
                t = torch.cat([p.packed for p in parts], dim=0)                  # [sum N_i, row bytes]
            row = 0
            for n, p in zip(names, parts):
                self.w[n] = QuantWeight(t[row:row + p.shape[0]], p.qtype, p.shape)
                row += p.shape[0]
            v = self._consts[(fused_name, "packed")] = self.g.constant(t, name=fused_name + ".packed")
        return v

    def _quant_matmul(self, x: Value, packed: Value, qtype: str, n: int, k: int) -> Value:
        return self.g.op.QuantMatMul(x, packed, qtype=qtype, n=n, k=k, _domain=SP)

    def _by_type(self, prefix: str, projs: list[str], fused: str, one: Callable[[list[str], str], Any]) -> tuple:
        """The projections ``projs`` of ``prefix`` whose weights mix quantized types (Q4_K_M puts some
        layers' ``v_proj`` in Q6_K), as one stacked op per type: ``one(subset, fused_name)`` builds the op of
        a same-type subset (a Split's values for two or more, a value for one); the outputs come back in
        the order of ``projs``. A weight that is not quantized is a subset of its own."""
        groups: dict[Any, list[str]] = {}
        for p in projs:
            w = self.w[prefix + p + ".weight"]
            groups.setdefault(w.qtype if isinstance(w, QuantWeight) else ("float", p), []).append(p)
        out: dict[str, Value] = {}
        for subset in groups.values():
            ys = one(subset, fused + "." + "+".join(subset) if len(subset) > 1 else "")
            out.update(zip(subset, ys if len(subset) > 1 else (ys,)))
        return tuple(out[p] for p in projs)

    def fused_linear(self, x: Value, prefix: str, projs: list[str], fused: str, bias: bool = False) -> tuple:
        """``[x @ W_p.T (+ b_p) for p in projs]`` as one MatMul (+ Add) and a Split on the last axis.
        Quantized weights stack only when they share a type (Q4_K_M files mix Q4_K and Q6_K): one
        QuantMatMul per type then (``_by_type``)."""
        names = [prefix + p for p in projs]
        ws = [self.w[n + ".weight"] for n in names]
        sizes = np.array([int(w.shape[0]) for w in ws], np.int64)
        if any(isinstance(w, QuantWeight) for w in ws):
            if not all(isinstance(w, QuantWeight) and w.qtype == ws[0].qtype for w in ws):
                def one(sub: list[str], name: str) -> Any:
                    if len(sub) > 1:
                        return self.fused_linear(x, prefix, sub, name, bias)
                    return self.linear(x, prefix + sub[0], bias)
                return self._by_type(prefix, projs, fused, one)
            y = self._quant_matmul(x, self.stacked_packed([n + ".weight" for n in names], prefix + fused + ".weight"),
                                   ws[0].qtype, int(sizes.sum()), ws[0].shape[1])
        else:
            y = self.g.op.MatMul(x, self.stacked([n + ".weight" for n in names], prefix + fused + ".weight", True))
        if bias:
            y = self.g.op.Add(y, self.stacked([n + ".bias" for n in names], prefix + fused + ".bias"))
        return self.g.op.Split(y, sizes, axis=-1, _outputs=len(names))

    def norm_linear(self, h: Value, norm: str, prefix: str, projs: list[str], fused: str, bias: bool = False,
                    glu: bool = False) -> Value | tuple:
        """RMSNorm(h) with weight ``norm``, then the projections ``projs`` of ``prefix`` stacked into one
        RMSNormMatMul (QuantRMSNormMatMul for quantized weights of one type): split back into one value
        per projection, or with ``glu`` (gate, up) the SiLU gate (one value). ``projs == [""]``: the
        single weight ``prefix + ".weight"``. Quantized weights of different types (Q4_K_M mixes Q4_K
        and Q6_K) stack per type (``_by_type``: q and k in one op, a Q6_K v in another), each op with the
        norm; a GLU's gate and up of different types, one op each."""
        names = [prefix + p for p in projs] if projs != [""] else [prefix]
        ws = [self.w[n + ".weight"] for n in names]
        quant = [isinstance(w, QuantWeight) for w in ws]
        if len(names) > 1 and any(quant) and not (all(quant) and all(w.qtype == ws[0].qtype for w in ws)):
            if glu:
                return self.silu_mul(*[self.norm_linear(h, norm, n, [""], "", bias) for n in names])

            def one(sub: list[str], name: str) -> Any:
                if len(sub) > 1:
                    return self.norm_linear(h, norm, prefix, sub, name, bias)
                return self.norm_linear(h, norm, prefix + sub[0], [""], "", bias)
            return self._by_type(prefix, projs, fused, one)
        eps, act = self.cfg.rms_norm_eps, "silu_mul" if glu else ""
        if all(quant):
            packed = self.packed(names[0] + ".weight") if len(names) == 1 else \
                self.stacked_packed([n + ".weight" for n in names], prefix + fused + ".weight")
            y = self.g.op.QuantRMSNormMatMul(h, self.const(norm), packed, qtype=ws[0].qtype,
                                             n=sum(int(w.shape[0]) for w in ws), k=int(ws[0].shape[1]),
                                             epsilon=eps, activation=act, _domain=SP)
        else:
            w_t = self.const(names[0] + ".weight", transpose=True) if len(names) == 1 else \
                self.stacked([n + ".weight" for n in names], prefix + fused + ".weight", True)
            y = self.g.op.RMSNormMatMul(h, self.const(norm), w_t, epsilon=eps, activation=act, _domain=SP)
        if bias:
            y = self.g.op.Add(y, self.const(names[0] + ".bias") if len(names) == 1 else
                              self.stacked([n + ".bias" for n in names], prefix + fused + ".bias"))
        if glu or len(names) == 1:
            return y
        sizes = np.array([int(w.shape[0]) for w in ws], np.int64)
        return self.g.op.Split(y, sizes, axis=-1, _outputs=len(names))

    def linear_add(self, a: Value, prefix: str, residual: Value, x_codes: Value | None = None,
                   prefetch: bool = False) -> Value:
        """``residual + a @ W.T`` as one MatMulAdd (QuantMatMulAdd for a quantized W; ``x_codes``: ``a`` as
        int8 codes, which its one-row kernel may read instead; ``prefetch``: MatMulAdd's weight prefetch, for
        the projection after the attention)."""
        w = self.w[prefix + ".weight"]
        if isinstance(w, QuantWeight):
            codes = () if x_codes is None else (x_codes,)
            return self.g.op.QuantMatMulAdd(a, self.packed(prefix + ".weight"), residual, *codes, qtype=w.qtype,
                                            n=int(w.shape[0]), k=int(w.shape[1]), _domain=SP,
                                            **_prefetch(prefetch))
        return self.g.op.MatMulAdd(a, self.const(prefix + ".weight", transpose=True), residual, _domain=SP,
                                   **_prefetch(prefetch))

    def linear(self, x: Value, prefix: str, bias: bool = False) -> Value:
        w = self.w[prefix + ".weight"]
        if isinstance(w, QuantWeight):
            y = self._quant_matmul(x, self.packed(prefix + ".weight"), w.qtype, *w.shape)
        else:
            y = self.g.op.MatMul(x, self.const(prefix + ".weight", transpose=True))
        return self.g.op.Add(y, self.const(prefix + ".bias")) if bias else y

    def embed(self, ids: Value) -> Value:
        """The embedding lookup ``W[ids]``: [B, S] -> [B, S, H]."""
        name = "model.embed_tokens.weight"
        w = self.w[name]
        if isinstance(w, QuantWeight):
            return self.g.op.QuantGather(self.packed(name), ids, qtype=w.qtype, n=w.shape[0], k=w.shape[1],
                                         dtype=str(self.dtype).replace("torch.", ""), _domain=SP)
        return self.g.op.Embedding(self.const(name), ids, _domain=SP)

    def rms_norm(self, x: Value, weight: str) -> Value:
        return self.g.op.RMSNormalization(x, self.const(weight), epsilon=self.cfg.rms_norm_eps, axis=-1,
                                          _domain=SP)
    def skip_rms_norm(self, x: Value, residual: Value, weight: str) -> tuple[Value, Value]:
        """(RMSNorm(residual + x), residual + x): the residual add fused with the next norm."""
        return self.g.op.SkipRMSNormalization(x, residual, self.const(weight), epsilon=self.cfg.rms_norm_eps,
                                              axis=-1, _domain=SP, _outputs=2)

    def silu_mul(self, gate: Value, up: Value) -> Value:
        if self.has_silu_mul:
            return self.g.op.SiluMul(gate, up, _domain=SP)
        return self.g.op.Mul(self.g.op.Mul(gate, self.g.op.Sigmoid(gate)), up)


@dataclass(slots=True, frozen=True)
class PagedKV:
    """The paged KV cache of the batched engine (shapeplan/llm/batch): one pool of ``num_blocks``
    blocks of ``block_size`` tokens per layer ([NB, Hkv, BS, D] for K and for V; block 0 is the null
    block, never given to a sequence), a block table of ``max_blocks`` entries per row, and
    ``state_slots`` rows of per-request sampling state (the last one serves padding rows)."""
    num_blocks: int
    block_size: int
    max_blocks: int
    state_slots: int


class _StaticKV:
    """One contiguous cache per layer, [B, Hkv, L, D], written at a position shared by every row."""
    rotates_q = False

    def __init__(self, g: Graph, cfg: LlamaConfig, batch: int, length: int, dtype: torch.dtype,
                 device: str | torch.device, state: dict[str, torch.Tensor]) -> None:
        self.g, self.cfg, self.batch, self.length, self.dtype, self.device = g, cfg, batch, length, dtype, device
        self.state, self.zero = state, {}
        self.ids = g.placeholder("input_ids", "int64", (batch, "seq"))
        self.position = g.placeholder("position", "int64", (1,))
        self.length_in = g.placeholder("length", "int64", (1,))
        hq, hkv = cfg.num_heads, cfg.num_kv_heads
        self.mask = g.op.CausalMask(self.ids, self.position, kv_length=length, window=cfg.sliding_window,
                                    groups=hq // hkv, dtype=dtype_name(dtype), _domain=SP)   # [G*S, L] additive

    def starts(self) -> Value:
        return self.position

    def layer(self, i: int, q: Value, k: Value, v: Value, cos_s: Value, sin_s: Value, scale: float) -> Value:
        cfg, op = self.cfg, self.g.op
        shape = (self.batch, cfg.num_kv_heads, self.length, cfg.head_dim)
        caches = [self.g.variable(n, self.state[n] if n in self.state else
                                  _zeros(shape, self.dtype, self.device, self.zero))
                  for n in (f"k_cache_{i}", f"v_cache_{i}")]
        k_all, v_all = op.CacheWriteKV(*caches, k, v, self.position, cos_s, sin_s, axis=2, _domain=SP,
                                       _outputs=2)            # RoPE(k), both writes: [B, Hkv, L, D] x 2
        return op.CachedAttention(q, k_all, v_all, self.mask, self.position, scale=scale,
                                  window=cfg.sliding_window, _domain=SP)                # [B, Hq, S, D]

    def last_tokens(self, h: Value) -> Value:
        op = self.g.op
        return op.Gather(h, op.Sub(self.length_in, np.array([1], np.int64)), axis=1)    # [B, 1, H]

    def next_position(self) -> Value:
        return self.g.op.Add(self.position, self.length_in)

    def sampling(self) -> tuple[Value, Value, Value, Value]:
        init = self.state if "sampling_params" in self.state else _sampling_state(self.cfg, self.batch, self.device)
        return tuple(self.g.variable(n, init[n]) for n in SAMPLING_STATE)


class _PagedKV:
    """Pools of blocks per layer, a block table per row, every row at its own position (PagedKV)."""
    rotates_q = True              # layer() takes q before RoPE and the rotary tables: PagedWriteAttention rotates

    def __init__(self, g: Graph, cfg: LlamaConfig, paged: PagedKV, dtype: torch.dtype,
                 device: str | torch.device, state: dict[str, torch.Tensor]) -> None:
        self.g, self.cfg, self.paged, self.dtype, self.device, self.state = g, cfg, paged, dtype, device, state
        self.ids = g.placeholder("input_ids", "int64", ("batch", "seq"))
        self.positions = g.placeholder("positions", "int64", ("batch",))
        self.lengths = g.placeholder("lengths", "int64", ("batch",))
        self.block_tables = g.placeholder("block_tables", "int32", ("batch", paged.max_blocks))
        self.state_slots = g.placeholder("state_slots", "int64", ("batch",))

    def starts(self) -> Value:
        return self.positions

    def layer(self, i: int, q: Value, k: Value, v: Value, cos: Value, sin: Value, scale: float,
              x_codes: bool = False) -> Value | tuple[Value, Value]:
        """(cos, sin: the rotary tables [L, D/2]; the op reads each row's rows itself.) ``x_codes``: also
        the output's first row as int8 codes for the o projection (PagedWriteAttention's second output)."""
        cfg, op, p = self.cfg, self.g.op, self.paged
        shape = (p.num_blocks, cfg.num_kv_heads, p.block_size, cfg.head_dim)
        pools = [self.g.variable(n, self.state[n] if n in self.state else
                                 torch.zeros(shape, dtype=self.dtype, device=self.device))
                 for n in (f"k_cache_{i}", f"v_cache_{i}")]
        # the decode attention kernel's counters (one per row and KV head, left zero; one variable per layer,
        # so a layer's state lives where the layer runs): see PagedWriteAttention
        name = f"attention.counters_{i}"
        counters = self.g.variable(name, self.state[name] if name in self.state else _counters(cfg, p, self.device)[0])
        # RoPE(k), both writes, RoPE(q), the attention: [B, Hq, S, D] (a decode step: one kernel on CUDA)
        if x_codes:
            return op.PagedWriteAttention(q, k, v, *pools, self.positions, self.lengths, self.block_tables,
                                          counters, cos, sin, scale=scale, window=cfg.sliding_window, x_codes=1,
                                          _outputs=2, _domain=SP)
        return op.PagedWriteAttention(q, k, v, *pools, self.positions, self.lengths, self.block_tables,
                                      counters, cos, sin, scale=scale, window=cfg.sliding_window, _domain=SP)

    def last_tokens(self, h: Value) -> Value:
        return self.g.op.LastToken(h, self.lengths, _domain=SP)                                 # [B, 1, H]

    def next_position(self) -> Value:
        return self.g.op.Add(self.positions, self.lengths)                                     # [B]

    def sampling(self) -> tuple[Value, Value, Value, Value]:
        init = self.state if "sampling_params" in self.state else \
            _sampling_state(self.cfg, self.paged.state_slots, self.device)
        rows = [self.g.variable(n, init[n]) for n in SAMPLING_STATE]
        return tuple(self.g.op.Gather(r, self.state_slots, axis=0) for r in rows)        # this batch's rows


def build_graph(cfg: LlamaConfig, weights: dict[str, torch.Tensor], *, max_kv_cache_length: int,
                batch: int = 1, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                tp: Any = None, fuse_projections: bool = True, state: dict[str, torch.Tensor] | None = None,
                paged: PagedKV | None = None, fuse_norms: bool = True) -> Graph:
    """The decoder graph of ``cfg`` with ``weights`` (Hugging Face names, see weights.expected_shapes).
    ``fuse_projections``: stack the q/k/v and gate/up weights (``weights``' entries are rebound to
    views of the stacked tensors: same values, one copy in memory).
    ``tp``: a ``shapeplan.parallel.TensorParallel`` (this rank's shard; see shapeplan/parallel/tensor.py).
    ``state``: ``initial_state``'s tensors, used as the variables' initial values and the rotary tables
    (an engine compiled with ``adopt_variables=True`` then keeps them as its state, without a copy).
    ``paged``: the batched engine's paged KV cache (``PagedKV``; inputs in the module doc) instead of
    one static cache of ``batch`` rows sharing a position.
    ``fuse_norms``: each norm + projection (+ SiLU gate or residual add) as one RMSNormMatMul / MatMulAdd
    (shapeplan/ops/fused_linear.py; quantized weights: QuantRMSNormMatMul / QuantMatMulAdd of
    shapeplan/ops/quantized.py: one Triton GEMV per projection in a decode step on CUDA); applies with
    ``fuse_projections`` and without ``tp``, else the unfused ops."""
    dtype = dtype or cfg.torch_dtype
    vocab = cfg.vocab_size
    if tp is not None and any(isinstance(w, QuantWeight) for w in weights.values()):
        from shapeplan.errors import ModelError
        raise ModelError("tensor parallelism does not shard quantized weights yet: load the model unquantized")
    if tp is not None:
        cfg, weights = tp.shard(cfg, weights)          # this rank's heads, MLP columns, vocab rows
    g = Graph(f"{cfg.model_type}_decoder")
    g.opset_imports[""] = max(g.opset_imports.get("", 21), 21)
    g.metadata.update({"model_type": cfg.model_type, "max_kv_cache_length": str(max_kv_cache_length)})
    b = _Builder(g, cfg, weights, dtype)
    op = g.op
    hq, hkv, d, L = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, max_kv_cache_length
    state = state or {}
    kv = _PagedKV(g, cfg, paged, dtype, device, state) if paged is not None else \
        _StaticKV(g, cfg, batch, L, dtype, device, state)
    ids = kv.ids

    cos, sin = (state["rope.cos"], state["rope.sin"]) if "rope.cos" in state else rope_tables(cfg, L, dtype)
    cos_c, sin_c = g.constant(cos, name="rope.cos"), g.constant(sin, name="rope.sin")   # [L, D/2]
    # what the layers rotate with: the paged attention reads the tables' rows at each row's positions;
    # the static cache takes this step's rows, gathered once per step (not per layer)
    rope_cos, rope_sin = cos_c, sin_c
    if not kv.rotates_q:
        pos_ids = op.PositionIds(ids, kv.starts(), _domain=SP)                         # [B, S]
        rope_cos, rope_sin = op.Gather(cos_c, pos_ids, axis=0), op.Gather(sin_c, pos_ids, axis=0)  # [B, S, D/2]
    q_shape = np.array([0, 0, hq, d], np.int64)
    kv_shape = np.array([0, 0, hkv, d], np.int64)
    merged = np.array([0, 0, hq * d], np.int64)

    h = b.embed(ids) if tp is None else tp.embed(g, b.const("model.embed_tokens.weight"), ids)  # [B, S, H]
    fused = fuse_norms and fuse_projections and tp is None
    x_codes = layers_x_codes(cfg, weights, device)
    x = None if fused else b.rms_norm(h, "model.layers.0.input_layernorm.weight")

    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        if fused:
            q, k, v = b.norm_linear(h, p + "input_layernorm.weight", p + "self_attn.",
                                    ["q_proj", "k_proj", "v_proj"], "qkv_proj", cfg.attention_bias)
        elif fuse_projections:
            q, k, v = b.fused_linear(x, p + "self_attn.", ["q_proj", "k_proj", "v_proj"], "qkv_proj",
                                     cfg.attention_bias)                              # [B, S, N_i]
        else:
            q, k, v = (b.linear(x, p + "self_attn." + n, cfg.attention_bias) for n in ("q_proj", "k_proj", "v_proj"))
        q = op.Reshape(q, q_shape)                                                    # [B, S, Hq, D]
        k = op.Reshape(k, kv_shape)                                                   # [B, S, Hkv, D]
        v = op.Reshape(v, kv_shape)
        if cfg.qk_norm:
            q = b.rms_norm(q, p + "self_attn.q_norm.weight")
            k = b.rms_norm(k, p + "self_attn.k_norm.weight")
        perm = [0, 2, 1, 3]
        q = op.Transpose(q, perm=perm)                                                # [B, Hq, S, D]
        if not kv.rotates_q:                           # the paged attention rotates q itself (one launch less)
            q = op.RotaryEmbedding(q, rope_cos, rope_sin, _domain=SP)
        k, v = op.Transpose(k, perm=perm), op.Transpose(v, perm=perm)                # [B, Hkv, S, D]
        codes = None
        if fused and paged is not None and x_codes[i]:
            a, codes = kv.layer(i, q, k, v, rope_cos, rope_sin, float(d) ** -0.5, x_codes=True)
        else:
            a = kv.layer(i, q, k, v, rope_cos, rope_sin, float(d) ** -0.5)              # [B, Hq, S, D]
        a = op.Reshape(op.Transpose(a, perm=perm), merged)                               # [B, S, Hq*D]
        if fused:                      # h += o; h += down(silu(gate) * up) of norm(h): two GEMVs each
            h = b.linear_add(a, p + "self_attn.o_proj", h, codes, prefetch=True)
            act = b.norm_linear(h, p + "post_attention_layernorm.weight", p + "mlp.", ["gate_proj", "up_proj"],
                                "gate_up_proj", glu=True)
            h = b.linear_add(act, p + "mlp.down_proj", h)
            continue
        x, h = b.skip_rms_norm(_reduce(tp, g, b.linear(a, p + "self_attn.o_proj")), h,
                               p + "post_attention_layernorm.weight")                  # h += o; x = norm(h)
        if fuse_projections:
            gate, up = b.fused_linear(x, p + "mlp.", ["gate_proj", "up_proj"], "gate_up_proj")
        else:
            gate, up = b.linear(x, p + "mlp.gate_proj"), b.linear(x, p + "mlp.up_proj")
        down = _reduce(tp, g, b.linear(b.silu_mul(gate, up), p + "mlp.down_proj"))
        if i + 1 < cfg.num_layers:                     # h += down, fused with the next layer's input norm
            x, h = b.skip_rms_norm(down, h, f"model.layers.{i + 1}.input_layernorm.weight")
        else:
            h = op.Add(h, down)

    head = "model.embed_tokens" if cfg.tie_word_embeddings else "lm_head"
    last = kv.last_tokens(h)                                                           # [B, 1, H]
    if fused:
        logits = op.Reshape(b.norm_linear(last, "model.norm.weight", head, [""], ""), np.array([0, -1], np.int64))
        all_logits = b.norm_linear(h, "model.norm.weight", head, [""], "")
    else:
        logits = op.Reshape(b.linear(b.rms_norm(last, "model.norm.weight"), head),
                            np.array([0, -1], np.int64))                               # [B, V]
        all_logits = b.linear(b.rms_norm(h, "model.norm.weight"), head)               # [B, S, V]
    if tp is not None:
        logits, all_logits = tp.gather_vocab(g, logits, vocab), tp.gather_vocab(g, all_logits, vocab)

    params, seed, seen, adjust = kv.sampling()
    next_position = kv.next_position()
    greedy = op.ArgMax(logits, axis=-1, keepdims=1)                                    # [B, 1]
    sampled = op.SampleToken(logits, params, seed, next_position, seen, adjust, _domain=SP)   # [B, 1]
    # log-probabilities of the model's distribution (raw logits, before temperature / top-k / penalty):
    # only the plans of batches where a request asked for them compute these outputs
    logp = op.LogSoftmax(op.Cast(logits, to=1), axis=-1)                               # [B, V] float32
    k = min(TOP_LOGPROBS, vocab)
    top_lp, top_ids = op.TopK(logp, np.array([k], np.int64), axis=-1, _outputs=2)      # [B, K] x 2
    greedy_lp = op.GatherElements(logp, greedy, axis=1)                                # [B, 1]
    sampled_lp = op.GatherElements(logp, sampled, axis=1)                              # [B, 1]
    outs = ((logits, "logits"), (greedy, "next_token"), (sampled, "next_token_sampled"),
            (next_position, "next_position"), (all_logits, "all_logits"), (greedy_lp, "next_token_logprob"),
            (sampled_lp, "next_token_sampled_logprob"), (top_lp, "top_logprobs"), (top_ids, "top_token_ids"))
    for v, name in outs:
        _rename(g, v, name)
    g.set_outputs(*(v for v, _ in outs))
    return g


def attention_x_codes(cfg: LlamaConfig, w_o: Any, device: str | torch.device) -> bool:
    """Whether a paged decode step's attention hands the o projection (weight ``w_o``) its x as int8 codes
    (PagedWriteAttention ``x_codes``, QuantMatMulAdd's fourth input), so that no x quantizer runs between
    them: ``SHAPEPLAN_QUANT_ATTN_X`` (auto: on CUDA where o runs the one-row kernel and its tile reads int8 x,
    qgemv.TUNE's XQ = 2 / 3; on: wherever o is a one-row type, for tests; off). Needs a quantized o and a
    head size that is a multiple of 32."""
    from shapeplan import env
    mode = env.get("SHAPEPLAN_QUANT_ATTN_X")
    if mode == "off" or not isinstance(w_o, QuantWeight) or cfg.head_dim % 32 or \
            mode == "auto" and torch.device(device).type != "cuda":
        return False
    try:
        from shapeplan.runtime.backends.triton.kernels import qgemv
    except ImportError:                                   # no Triton: nothing would read the codes
        return False
    n, k = (int(v) for v in w_o.shape)
    if w_o.qtype not in qgemv.K_MULTIPLE or k % qgemv.K_MULTIPLE[w_o.qtype]:
        return False
    if mode == "on":
        return True
    return (qgemv.AVAILABLE and env.get("SHAPEPLAN_LLM_FUSED_GEMV") and env.get("SHAPEPLAN_QUANT_ONE_ROW")
            and qgemv.config(w_o.qtype, n, k)[3] >= 2)       # (INT8_X=0 makes every XQ 1 there)


def layers_x_codes(cfg: LlamaConfig, weights: dict[str, Any], device: str | torch.device) -> list[bool]:
    """``attention_x_codes`` of every layer's o projection (a paged, fused graph's; the pipeline's start-up
    compiles the decode kernel variants these need)."""
    return [attention_x_codes(cfg, weights.get(f"model.layers.{i}.self_attn.o_proj.weight"), device)
            for i in range(cfg.num_layers)]


#: the sampling variables, a row per batch row (a state slot when paged): settings, seed, the tokens in the
#: context (repetition penalty), the additive terms on the logits (presence / frequency penalty, logit bias)
SAMPLING_STATE = ("sampling_params", "sampling_seed", "seen_tokens", "logit_adjust")


def _sampling_state(cfg: LlamaConfig, batch: int, device: str | torch.device) -> dict[str, torch.Tensor]:
    return {"sampling_params": torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0]] * batch, device=device),
            "sampling_seed": torch.zeros(batch, dtype=torch.int64, device=device),
            "seen_tokens": torch.zeros(batch, cfg.vocab_size, dtype=torch.bool, device=device),
            "logit_adjust": torch.zeros(batch, cfg.vocab_size, dtype=torch.float32, device=device)}


#: CPU buffers from this many bytes on are zeroed by the OS (``zeros``)
LAZY_ZERO_BYTES = 1 << 26


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """``torch.zeros``, but on the CPU from ``LAZY_ZERO_BYTES`` on the memory comes from numpy's ``zeros``
    (``calloc``: a large block is fresh pages from the OS, zero until first written). ``torch.zeros`` writes
    every byte at once: the paged KV pool of llama-1b (2.1 GB for 64 sequences of 1,024 tokens) took 2.8 s
    of the CPU pipeline's construction and all of that memory, where a request touches only its blocks."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < LAZY_ZERO_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


def initial_state(cfg: LlamaConfig, *, max_kv_cache_length: int, dtype: torch.dtype | None = None,
                  device: str | torch.device = "cpu", batch: int = 1, paged: PagedKV | None = None
                  ) -> dict[str, torch.Tensor]:
    """The device tensors ``build_graph(state=...)`` takes: every layer's K and V cache as views of one
    zero buffer, the sampling state, and the rotary tables, made with a handful of device calls. With
    ``paged``, the caches are the pools ([NB, Hkv, BS, D] per layer and K/V), views of one buffer
    ``kv.blocks`` [layers, 2, NB, Hkv, BS, D] (so one indexing op copies a block across every layer),
    and the sampling state has ``paged.state_slots`` rows.

    The LLM pipeline makes them before its CUDA warm-up threads start: while those load CUDA modules,
    another thread's device calls wait for them, and the engine's 35 variable copies plus the tables'
    host-to-device copies waited ~0.13 s on the H200 (docs/benchmarks/decode.md round 8)."""
    dtype = dtype or cfg.torch_dtype
    hkv, d, n = cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    if paged is not None:
        kv = zeros((n, 2, paged.num_blocks, hkv, paged.block_size, d), dtype, device)
        rows = paged.state_slots
    else:
        kv = zeros((n, 2, batch, hkv, max_kv_cache_length, d), dtype, device)
        rows = batch
    out = {"kv.blocks": kv} if paged is not None else {}
    counters = _counters(cfg, paged, device, n) if paged is not None else None
    for i in range(n):
        out[f"k_cache_{i}"], out[f"v_cache_{i}"] = kv[i, 0], kv[i, 1]
        if counters is not None:
            out[f"attention.counters_{i}"] = counters[i]
    out.update(_sampling_state(cfg, rows, device))
    cos, sin = rope_tables(cfg, max_kv_cache_length, dtype)
    out["rope.cos"], out["rope.sin"] = cos.to(device), sin.to(device)
    return out


def _counters(cfg: LlamaConfig, paged: PagedKV, device: str | torch.device, layers: int = 1) -> torch.Tensor:
    """Zeros for PagedWriteAttention's counters, [layers, n]: one per KV head of every row a batch can have
    (a decode bucket holds at most max(state_slots - 1, 16) rows: batch/runner.decode_buckets)."""
    return torch.zeros(layers, max(paged.state_slots, 16) * cfg.num_kv_heads, dtype=torch.int32, device=device)


def _reduce(tp: Any, g: Graph, partial: Value) -> Value:
    return partial if tp is None else tp.reduce(g, partial)        # row-parallel: sum over ranks


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device,
           zero: dict[tuple, torch.Tensor] | None = None) -> torch.Tensor:
    """A zero initial value that costs one element: the engine materializes its own copy of each
    variable, so the graph need not hold a second full-size KV cache. ``zero``: one element per
    (dtype, device) shared by every cache (one device allocation and fill instead of one per cache)."""
    zero = {} if zero is None else zero
    key = (dtype, str(device))
    if key not in zero:
        zero[key] = torch.zeros((), dtype=dtype, device=device)
    return zero[key].expand(shape)


def _rename(g: Graph, v: Value, name: str) -> None:
    del g.values[v.name]
    v.name = name
    g.values[name] = v
