"""Tensor parallelism for the Llama-family builder (Megatron layout): every rank holds a slice of each
layer and the same graph structure; two collectives per layer keep the residual stream replicated.

    q/k/v, gate/up   column-parallel: rank r keeps its heads' rows (Hq/N and Hkv/N heads, F/N rows)
    o, down          row-parallel:    rank r keeps the matching input columns; AllReduce(sum) after
    embedding        vocab-parallel:  rank r keeps rows [r*Vs, (r+1)*Vs); ids outside give 0; AllReduce
    LM head          vocab-parallel:  logits of its Vs rows; AllGather on the vocab axis (then the
                                      padding rows, when N does not divide V, are sliced off)

Norms, rotary tables, masks, sampling are replicated: every rank computes the same full logits and
picks the same token, so each rank can feed its own ``next_token`` back without a broadcast.

The builder (``shapeplan.llm.model.build_graph(..., tp=TensorParallel(rank, n))``) calls ``shard``
once, then ``embed``, ``reduce`` and ``gather_vocab`` at those four places; nothing else changes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from shapeplan.errors import ModelError
from shapeplan.ir.graph import Graph, Value

SP = "shapeplan"


@dataclass(slots=True, frozen=True)
class TensorParallel:
    rank: int
    world_size: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ModelError(f"tensor parallel rank {self.rank} is not in [0, {self.world_size})")

    # ------------------------------------------------------------------ weights
    def check(self, cfg) -> None:
        n = self.world_size
        bad = [f"{what}={v}" for what, v in (("num_attention_heads", cfg.num_heads),
                                              ("num_key_value_heads", cfg.num_kv_heads),
                                              ("intermediate_size", cfg.intermediate_size)) if v % n]
        if bad:
            raise ModelError(f"tensor parallel size {n} must divide {', '.join(bad)}")

    def vocab_shard(self, vocab: int) -> tuple[int, int]:
        """(first row, rows per rank): rows per rank = ceil(V / N); the last shard is zero-padded."""
        per = -(-vocab // self.world_size)
        return self.rank * per, per

    def shard(self, cfg, weights: dict[str, torch.Tensor]):
        """(this rank's config, this rank's weights). The config keeps the full ``vocab_size`` (the
        sampling state and the gathered logits are full-vocabulary); heads and MLP width are local."""
        self.check(cfg)
        n, r = self.world_size, self.rank
        local = dataclasses.replace(cfg, num_heads=cfg.num_heads // n, num_kv_heads=cfg.num_kv_heads // n,
                                    intermediate_size=cfg.intermediate_size // n)
        d = cfg.head_dim
        q, kv, f = local.num_heads * d, local.num_kv_heads * d, local.intermediate_size
        start, per = self.vocab_shard(cfg.vocab_size)
        out: dict[str, torch.Tensor] = {}
        for name, t in weights.items():
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                part = t[start:start + per]
                if part.shape[0] < per:                                     # zero rows past V
                    part = torch.cat([part, part.new_zeros(per - part.shape[0], *part.shape[1:])])
            elif name.endswith(("q_proj.weight", "q_proj.bias")):
                part = t[r * q:(r + 1) * q]
            elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
                part = t[r * kv:(r + 1) * kv]
            elif name.endswith(("gate_proj.weight", "up_proj.weight")):
                part = t[r * f:(r + 1) * f]
            elif name.endswith("o_proj.weight"):
                part = t[:, r * q:(r + 1) * q]
            elif name.endswith("down_proj.weight"):
                part = t[:, r * f:(r + 1) * f]
            else:
                out[name] = t                                                # replicated (norms)
                continue
            out[name] = part.contiguous() if n > 1 else part
        return local, out

    # ------------------------------------------------------------------ graph pieces
    def embed(self, g: Graph, table: Value, ids: Value) -> Value:
        """Vocab-parallel lookup: this rank's rows for ids in its range, 0 elsewhere, summed over ranks."""
        op = g.op
        if self.world_size == 1:
            return op.Gather(table, ids, axis=0)
        start, per = self.vocab_shard(int(table.shape[0]) * self.world_size)
        local = op.Sub(ids, np.array(start, np.int64))                                      # [B, S]
        inside = op.And(op.GreaterOrEqual(local, np.array(0, np.int64)),
                        op.Less(local, np.array(per, np.int64)))
        rows = op.Gather(table, op.Where(inside, local, np.array(0, np.int64)), axis=0)       # [B, S, H]
        zero = g.constant(torch.zeros((), dtype=table.data.dtype), name=g.fresh_name("embed_zero"))
        rows = op.Where(op.Unsqueeze(inside, np.array([-1], np.int64)), rows, zero)
        return self.reduce(g, rows)

    def reduce(self, g: Graph, partial: Value) -> Value:
        """Sum of the ranks' partial outputs of a row-parallel projection."""
        return partial if self.world_size == 1 else g.op.AllReduce(partial, op="sum", _domain=SP)

    def gather_vocab(self, g: Graph, logits: Value, vocab: int) -> Value:
        """Full-vocabulary logits from each rank's vocabulary slice (last axis)."""
        if self.world_size == 1:
            return logits
        full = g.op.AllGather(logits, world_size=self.world_size, axis=-1, _domain=SP)
        if self.vocab_shard(vocab)[1] * self.world_size != vocab:
            full = g.op.Slice(full, np.array([0], np.int64), np.array([vocab], np.int64), np.array([-1], np.int64))
        return full

