"""A gpt-fast-style PyTorch decoder over the same weights (Hugging Face names): static KV cache, the
q/k/v and gate/up projections each one ``F.linear`` over a stacked weight, torch's fused
``F.rms_norm``, one SDPA per layer. The strongest plain-PyTorch formulation we know how to write: it is
the baseline of ``shapeplan bench --vs-torch-compile`` (eager, eager + one CUDA graph per step,
torch.compile reduce-overhead) and a second, independent check of the graph builder."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from shapeplan.llm.config import LlamaConfig, rope_tables


def _linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, or a packed weight's own matmul (``reference_int4.Int4Linear``)."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, b)
    return w(x) if b is None else w(x) + b


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` stacked along dim 0: a view when the pipeline already holds them as consecutive rows of
    one buffer (model.build_graph rebinds the checkpoint names to such views), else a copy."""
    from shapeplan.llm.model import _already_stacked
    view = _already_stacked(parts, parts[0].dtype)
    return view if view is not None else torch.cat(parts, dim=0)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, S, D]; cos/sin: [S, D/2]
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[None, None], sin[None, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class TorchDecoder(torch.nn.Module):
    def __init__(self, cfg: LlamaConfig, weights: dict[str, torch.Tensor], *, max_kv_cache_length: int,
                 device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.cfg, self.w = cfg, weights
        self.dtype = dtype or cfg.torch_dtype
        self.L = max_kv_cache_length
        shape = (1, cfg.num_kv_heads, max_kv_cache_length, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=device) for _ in range(cfg.num_layers)]
        cos, sin = rope_tables(cfg, max_kv_cache_length, self.dtype)
        self.cos, self.sin = cos.to(device), sin.to(device)
        for i, (k, v) in enumerate(zip(self.k, self.v)):     # buffers: static addresses for torch.compile
            self.register_buffer(f"k_cache_{i}", k, persistent=False)
            self.register_buffer(f"v_cache_{i}", v, persistent=False)
        # an int4 copy of a tied head sits under lm_head.weight (reference_int4.int4_weights)
        self.head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        # q/k/v and gate/up as one F.linear each over stacked weights (packed int4 weights: one each)
        self.qkv, self.qkv_bias, self.gate_up = [], [], []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            qkv = [weights[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
            gu = [weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]]
            plain = all(isinstance(t, torch.Tensor) for t in qkv + gu)
            self.qkv.append(_stacked(qkv) if plain else None)
            self.qkv_bias.append(_stacked([weights[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
                                 if plain and cfg.attention_bias else None)
            self.gate_up.append(_stacked(gu) if plain else None)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids [1, S], pos int64 [S] (absolute positions) -> logits of the last position [1, V]."""
        cfg, w = self.cfg, self.w
        b, s = ids.shape
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        g = hq // hkv
        h = F.embedding(ids, w["model.embed_tokens.weight"])
        cos, sin = self.cos[pos], self.sin[pos]
        mask = torch.arange(self.L, device=ids.device)[None, :] <= pos[:, None]       # [S, L]
        if cfg.sliding_window:
            mask = mask & (torch.arange(self.L, device=ids.device)[None, :] > pos[:, None] - cfg.sliding_window)
        mask = mask.repeat(g, 1)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            x = _rms(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            bias = cfg.attention_bias
            if self.qkv[i] is not None:
                q, k, v = F.linear(x, self.qkv[i], self.qkv_bias[i]).split([hq * d, hkv * d, hkv * d], dim=-1)
            else:
                q, k, v = (_linear(x, w[p + f"self_attn.{n}_proj.weight"], w[p + f"self_attn.{n}_proj.bias"] if bias
                                   else None) for n in "qkv")
            q, k, v = q.view(b, s, hq, d), k.view(b, s, hkv, d), v.view(b, s, hkv, d)
            if cfg.qk_norm:
                q = _rms(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
                k = _rms(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
            q = _rope(q.transpose(1, 2), cos, sin)
            k = _rope(k.transpose(1, 2), cos, sin)
            self.k[i].index_copy_(2, pos, k)
            self.v[i].index_copy_(2, pos, v.transpose(1, 2))
            qg = q.reshape(b, hkv, g * s, d)
            a = F.scaled_dot_product_attention(qg, self.k[i], self.v[i], attn_mask=mask)
            a = a.reshape(b, hq, s, d).transpose(1, 2).reshape(b, s, hq * d)
            h = h + _linear(a, w[p + "self_attn.o_proj.weight"])
            x = _rms(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            if self.gate_up[i] is not None:
                gate, up = F.linear(x, self.gate_up[i]).chunk(2, dim=-1)
            else:
                gate, up = _linear(x, w[p + "mlp.gate_proj.weight"]), _linear(x, w[p + "mlp.up_proj.weight"])
            act = F.silu(gate) * up
            h = h + _linear(act, w[p + "mlp.down_proj.weight"])
        h = _rms(h[:, -1:], w["model.norm.weight"], cfg.rms_norm_eps)
        return _linear(h, self.head)[:, 0]                                          # [1, V]

    def decode_step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tok [1, 1], pos [1] -> greedy next token [1, 1] (no host sync)."""
        return self.forward(tok, pos).argmax(-1, keepdim=True)

    def generate(self, ids: list[int], n: int) -> list[int]:
        dev = self.k[0].device
        t = torch.tensor([ids], device=dev)
        tok = self.forward(t, torch.arange(len(ids), device=dev)).argmax(-1, keepdim=True)
        out = [tok]
        for i in range(n - 1):
            tok = self.decode_step(tok, torch.tensor([len(ids) + i], device=dev))
            out.append(tok)
        return torch.cat(out, 1)[0].tolist()
