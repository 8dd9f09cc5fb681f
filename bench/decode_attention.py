"""Decode attention on the GPU: the Triton split-K kernel's variants (split, warps, dot) against SDPA over
the whole static cache, at the llama-1b / 8b head layout (32 query heads, 8 KV heads, head dim 64,
bf16). Per variant: max error vs SDPA and time per call inside a CUDA graph of one call per layer (16
separate caches). Prints a table, then ``BEST=split,warps,dot`` (the fastest variant within the bf16
tolerance), a value for SHAPEPLAN_DECODE_ATTN.

    python3 -m bench.decode_attention --pos 256
"""
from __future__ import annotations

import argparse

import torch

from shapeplan.llm.bench import cuda_graph
from shapeplan.ops import llm as llm_ops
from shapeplan.runtime.backends.triton.kernels import decode_attention as da

VARIANTS = [(64, 4, False), (32, 2, False), (32, 4, False), (128, 4, False), (16, 2, False),
            (16, 4, True), (32, 4, True), (64, 4, True), (32, 2, True), (64, 2, True), (128, 4, True)]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.decode_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pos", type=int, default=256, help="position of the query: live cache length (default 256)")
    ap.add_argument("--length", type=int, default=1024, help="static cache length (default 1024)")
    ap.add_argument("--layers", type=int, default=16, help="calls (separate caches) per CUDA graph (default 16)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench.decode_attention: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return
    hq, hkv, d, L, dev = 32, 8, 64, a.length, "cuda"
    torch.manual_seed(0)
    q = torch.randn(1, hq, 1, d, device=dev, dtype=torch.bfloat16)
    ks = [torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16) for _ in range(a.layers)]
    vs = [torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16) for _ in range(a.layers)]
    p = torch.tensor([a.pos], device=dev)
    mask = llm_ops.causal_mask(torch.zeros(1, 1, dtype=torch.int64, device=dev), p, kv_length=L, groups=hq // hkv,
                               dtype="bfloat16")
    old = llm_ops.set_decode_attention("sdpa")
    ref = llm_ops.cached_attention(q, ks[0], vs[0], mask, scale=d ** -0.5).float()
    rows = []

    def timed(fn) -> float:
        gr = cuda_graph(fn, warmups=1)
        for _ in range(5):
            gr.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(7):
            e0.record()
            for _ in range(20):
                gr.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3 / (20 * a.layers))
        return sorted(ts)[len(ts) // 2]

    t_sdpa = timed(lambda: [llm_ops.cached_attention(q, k, v, mask, scale=d ** -0.5) for k, v in zip(ks, vs)])
    print(f"{'variant':<22} {'us/call':>8} {'max err':>9}")
    print(f"{'sdpa (whole cache)':<22} {t_sdpa:>8.2f} {0:>9.1e}")
    llm_ops.set_decode_attention(old)
    for split, warps, dot in VARIANTS:
        da.configure(split, warps, dot)
        try:
            out = da.decode_attention(q, ks[0], vs[0], p, scale=d ** -0.5).float()
            err = (out - ref).abs().max().item()
            t = timed(lambda: [da.decode_attention(q, k, v, p, scale=d ** -0.5) for k, v in zip(ks, vs)])
        except Exception as e:  # noqa: BLE001
            print(f"{split},{warps},{dot}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        rows.append((t, err, split, warps, dot))
        print(f"{f'{split},{warps},{int(dot)}':<22} {t:>8.2f} {err:>9.1e}")
    ok = [r for r in rows if r[1] <= 2e-2]
    best = min(ok) if ok else (0, 0, 64, 4, False)
    print(f"BEST={best[2]},{best[3]},{int(best[4])}")


if __name__ == "__main__":
    main()
