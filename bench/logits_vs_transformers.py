"""Decode logits of our pipeline vs transformers on the SAME weights (preset, random bf16 by default):
teacher-forced over prompt + N steps, report max |logit diff| and top-1 agreement per step.

    python3 -m bench.logits_vs_transformers --preset llama-1b --steps 256 --modes slot_by_slot,triton [--json F]
    python3 -m bench.logits_vs_transformers --preset llama-tiny --dtype float32 --steps 16    # on a CPU

transformers runs one forward over the whole sequence; we run prefill, then one decode step per
token, feeding the same tokens (our own greedy picks), so the comparison is step by step.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from shapeplan.llm.bench import bench_prompt
from shapeplan.llm.config import LlamaConfig, preset_config
from shapeplan.llm.pipeline import GenerationPipeline
from shapeplan.llm.weights import random_weights


def hf_model(cfg: LlamaConfig, weights: dict[str, torch.Tensor], device: str):
    import transformers
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {"rope_type": "default"})})
    dtype = weights["model.embed_tokens.weight"].dtype
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(hf_cfg, dtype=dtype).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


def compare(cfg: LlamaConfig, weights: dict[str, torch.Tensor], *, device: str, mode: str, prompt_len: int,
            steps: int, max_kv: int = 1024, optimize: bool = True) -> dict:
    pipe = GenerationPipeline(cfg, weights, None, device=device, mode=mode, dtype=weights[
        "model.embed_tokens.weight"].dtype, max_prefill_length=max(prompt_len, 16), max_kv_cache_length=max_kv,
        eos_token_ids=[], optimize=optimize)
    prompt = bench_prompt(cfg.vocab_size, prompt_len)
    seq = prompt + pipe.generate(prompt, max_new_tokens=steps).token_ids[:steps - 1]    # teacher tokens
    eng = pipe.engine
    outs = ["logits", "next_token", "next_position"]
    n = len(prompt)
    bucket = pipe.bucket_for(n, 0)
    ids = torch.zeros(1, bucket, dtype=torch.int64)
    ids[0, :n] = torch.tensor(prompt)
    dev = torch.device(device)
    r = eng.run({"input_ids": ids.to(dev), "position": torch.tensor([0], device=dev),
                 "length": torch.tensor([n], device=dev)}, outputs=outs)
    ours = [r["logits"][0].float().clone()]
    one = torch.ones(1, dtype=torch.int64, device=dev)
    for i in range(n, len(seq)):
        r = eng.run({"input_ids": torch.tensor([[seq[i]]], device=dev), "position": torch.tensor([i], device=dev),
                     "length": one}, outputs=outs)
        ours.append(r["logits"][0].float().clone())
    del pipe, eng
    model = hf_model(cfg, weights, device)
    with torch.no_grad():
        ref = model(torch.tensor([seq], device=dev)).logits[0, n - 1:].float()          # [steps, V]
    ours_t = torch.stack(ours)
    diff = (ours_t - ref).abs().amax(-1)
    top1 = (ours_t.argmax(-1) == ref.argmax(-1)).float()
    return {"mode": mode, "steps": len(ours), "max_abs_diff": diff.max().item(),
            "mean_max_abs_diff": diff.mean().item(), "top1_agreement": top1.mean().item(),
            "logit_scale": ref.abs().amax(-1).mean().item()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.logits_vs_transformers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--modes", default="slot_by_slot,cuda_graphs")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--std", type=float, default=0.02, help="weight init std (larger = fewer argmax near-ties)")
    ap.add_argument("--no-optimize", action="store_true")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    cfg = preset_config(args.preset, args.dtype)
    weights = random_weights(cfg, device=args.device, seed=0, std=args.std)
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        try:
            rows.append(compare(cfg, weights, device=args.device, mode=mode, prompt_len=args.prompt_len,
                                steps=args.steps, optimize=not args.no_optimize))
        except Exception as e:  # noqa: BLE001
            rows.append({"mode": mode, "error": f"{type(e).__name__}: {e}"[:300]})
    print(f"{args.preset} {args.dtype} on {args.device}: decode logits vs transformers, teacher-forced")
    for r in rows:
        if "error" in r:
            print(f"  {r['mode']:<16} FAILED {r['error']}")
        else:
            print(f"  {r['mode']:<16} steps {r['steps']:>4}  max|diff| {r['max_abs_diff']:.4g}  "
                  f"mean per-step max|diff| {r['mean_max_abs_diff']:.4g}  top-1 {100 * r['top1_agreement']:.1f}%  "
                  f"(|logit| ~{r['logit_scale']:.3g})")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"preset": args.preset, "dtype": args.dtype, "device": args.device, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
