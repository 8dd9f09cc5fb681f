"""A tiny random Llama-family checkpoint + BPE tokenizer written to disk (no downloads), and the
demo that generates with it (``shapeplan demo`` calls ``run_demo``; the tests reuse the writer)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Explain KV caching: keys and values of past tokens are stored so each new token attends to them.",
    "A compile-once, replay-many engine captures a decode step and replays it for every token.",
    "Hello world! Python, torch and ONNX: shapes, plans, segments and graphs.",
    "Once upon a time there was a small model that generated text one token at a time.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 -- + * / = ( ) [ ] { } < > ? ! . , ; :",
]

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")

_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
         "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}


def write_tokenizer(path: str, vocab_size: int = 320) -> int:
    """Train a byte-level BPE tokenizer on a small built-in corpus; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer)
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                   "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return tok.get_vocab_size()


def make_tiny_checkpoint(path: str, model_type: str = "llama", *, seed: int = 0, num_layers: int = 2,
                         hidden: int = 64, heads: int = 4, kv_heads: int = 2, init_std: float = 0.2,
                         shard: bool = False, **overrides: Any) -> str:
    """Write a random-weight ``model_type`` checkpoint (transformers' save_pretrained, safetensors) plus
    a trained BPE tokenizer to ``path``. A large ``init_std`` keeps greedy picks away from near-ties."""
    import torch
    import transformers
    vocab = write_tokenizer(path)
    cfg_cls = getattr(transformers, _ARCH[model_type].replace("ForCausalLM", "Config"))
    kw: dict[str, Any] = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=num_layers, num_attention_heads=heads,
                              num_key_value_heads=kv_heads, max_position_embeddings=512,
                              initializer_range=init_std, bos_token_id=0, eos_token_id=1,
                              tie_word_embeddings=model_type in ("qwen2", "qwen3"))
    if model_type == "qwen3":
        kw["head_dim"] = hidden // heads
    if model_type == "phi3":
        kw["pad_token_id"] = None                      # (Phi-3's default, 32000, is past this vocabulary)
    kw.update(overrides)
    cfg = cfg_cls(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, _ARCH[model_type])(cfg).eval()
    with torch.no_grad():      # norms default to ones; perturb them so a wrong norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, max_shard_size="20KB" if shard else "5GB")
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    model.generation_config.do_sample = False
    model.generation_config.save_pretrained(path)
    return path


def run_demo(device: str = "cpu", prompt: str = "Once upon a time", max_new_tokens: int = 24,
             mode: str = "auto", print_fn: Any = print) -> Any:
    """Build a tiny random model + tokenizer in a temp dir and generate (the text is gibberish: the
    weights are random). Returns the GenerationResult."""
    from shapeplan.llm.pipeline import GenerationPipeline
    from shapeplan.llm.sampling import Sampling
    with tempfile.TemporaryDirectory(prefix="shapeplan-demo-llm-") as d:
        make_tiny_checkpoint(d, "llama")
        pipe = GenerationPipeline.from_pretrained(d, device=device, mode=mode, max_prefill_length=64,
                                                  max_kv_cache_length=128, progress=False)
        res = pipe.generate(prompt, max_new_tokens=max_new_tokens, sampling=Sampling.greedy())
    m = res.metrics
    print_fn(f"tiny llama (random weights), mode={mode}, device={device}")
    print_fn(f"prompt: {prompt!r}")
    print_fn(f"output: {res.text!r}")
    print_fn(f"{len(res.token_ids)} tokens, finish={res.finish_reason}, TTFT {m.ttft_s * 1e3:.1f} ms, "
             f"decode {m.decode_tok_s:.0f} tok/s, effective {m.effective_tok_s:.0f} tok/s")
    return res
