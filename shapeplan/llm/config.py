"""Model configuration for the Llama family, read from a Hugging Face ``config.json``.

One dataclass covers Llama 2/3, Mistral, Qwen2/2.5, Qwen3 and Phi-3: they differ only in a few switches
(qkv bias, q/k norm, rope scaling, sliding window, tied embeddings; Phi-3 stores q/k/v and gate/up fused,
which the weight reader splits: weights.FUSED).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from shapeplan.errors import ModelError
from shapeplan.ir.dtypes import dtype_name

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")


def read_json(path: str) -> dict[str, Any]:
    """A checkpoint's JSON file (config.json, generation_config.json, tokenizer_config.json, an index) as a
    dict, or a ModelError that names the file and what is wrong with it: not UTF-8, not JSON, not an object.
    A missing file is the caller's FileNotFoundError."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (ValueError, RecursionError) as e:          # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{path}: not valid JSON (UTF-8 text expected): {type(e).__name__}: {e}") from None
    if not isinstance(d, dict):
        raise ModelError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d


def eos_ids(eos: Any, source: str) -> list[int]:
    """An ``eos_token_id`` field (an id or a list of ids) as a list, or a ModelError naming ``source``."""
    if isinstance(eos, int) and not isinstance(eos, bool):
        return [eos]
    if isinstance(eos, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
        return list(eos)
    raise ModelError(f"{source}: eos_token_id must be a token id or a list of token ids, got {eos!r:.80}")


@dataclass(slots=True)
class LlamaConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None     # {"rope_type": "llama3", "factor": ..., ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False                    # Qwen2: bias on q/k/v projections
    qk_norm: bool = False                           # Qwen3: RMSNorm on each head's q and k
    sliding_window: int = 0                         # 0 = full attention
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def num_parameters(self) -> int:
        h, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * f + 2 * h
        if self.attention_bias:
            layer += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            layer += 2 * self.head_dim
        return v * h * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + h

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "config.json") -> "LlamaConfig":
        mt = d.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ModelError(f"{source}: model_type {mt!r} is not supported; supported model types: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        try:
            hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
            theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
            partial = float(rope.pop("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0)
            if partial != 1.0:
                raise ModelError(f"{source}: partial rotary embeddings (partial_rotary_factor={partial}) are not "
                                 "supported")
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type not in ("default", "llama3", "linear"):
                raise ModelError(f"{source}: rope type {rope_type!r} is not supported "
                                 "(supported: default, linear, llama3)")
            window = d.get("sliding_window") or 0
            if mt == "qwen2" and not d.get("use_sliding_window", False):
                window = 0
            if mt == "qwen3" and not d.get("use_sliding_window", False):
                window = 0
            eos = d.get("eos_token_id")
            eos_list = [] if eos is None else eos_ids(eos, source)
            dt = d.get("dtype") or d.get("torch_dtype") or "float32"
            return cls(
                model_type=mt,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=rope if rope_type != "default" else None,
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bool(d.get("attention_bias", mt == "qwen2")),
                qk_norm=mt == "qwen3",
                sliding_window=int(window),
                dtype=dtype_name(dt),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=eos_list,
            )
        except KeyError as e:
            raise ModelError(f"{source}: required field {e.args[0]!r} is missing") from None
        except (TypeError, ValueError, ZeroDivisionError) as e:     # a field of the wrong type, or 0 heads
            raise ModelError(f"{source}: a field has a value this model cannot have: {type(e).__name__}: {e}") \
                from None

    @classmethod
    def from_file(cls, path: str) -> "LlamaConfig":
        cfg = os.path.join(path, "config.json") if os.path.isdir(path) else path
        try:
            d = read_json(cfg)
        except FileNotFoundError:
            raise ModelError(f"{cfg}: not found (a Hugging Face checkpoint directory needs config.json)") from None
        return cls.from_dict(d, source=cfg)


def inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Rotary inverse frequencies [D/2] (float32), with Llama 3 / linear scaling applied as in
    transformers' ``ROPE_INIT_FUNCTIONS``."""
    d = cfg.head_dim
    freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling
    if not sc:
        return freq
    kind = sc.get("rope_type", sc.get("type"))
    if kind == "freq_factors":      # GGUF's rope_freqs tensor (Llama 3): one divisor per frequency
        return freq / torch.tensor(sc["factors"], dtype=torch.float32)
    factor = float(sc.get("factor", 1.0))
    if kind == "linear":
        return freq / factor
    low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
    old = float(sc.get("original_max_position_embeddings", 8192))
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / freq
    out = torch.where(wavelen > low_wl, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return torch.where(medium, smoothed, out)


def rope_tables(cfg: LlamaConfig, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin caches [length, D/2] for positions 0..length-1 (computed in float32, then cast)."""
    t = torch.arange(length, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq(cfg))
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


#: random-weight presets (shapes of public models) for benchmarks: no checkpoint needed
PRESETS: dict[str, dict[str, Any]] = {
    "llama-tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2),
    "llama-125m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4),
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                     tie_word_embeddings=True,
                     rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def preset_config(name: str, dtype: str = "bfloat16") -> LlamaConfig:
    if name not in PRESETS:
        raise ModelError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    d = {"model_type": "llama", "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
         "eos_token_id": [], "dtype": dtype, **PRESETS[name]}
    return LlamaConfig.from_dict(d, source=f"preset {name}")
