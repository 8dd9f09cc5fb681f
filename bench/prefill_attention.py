"""Prefill attention on the GPU: torch's SDPA choice (cuDNN on Hopper with torch >= 2.11) vs the
memory-efficient kernel called directly, at llama-1b's grouped layout (q [1, Hkv, G*S, D] over a static
cache [1, Hkv, L, D], additive mask [G*S, L]).

    python3 -m bench.prefill_attention [--shapes 128x1024,512x1024,512x4096,2048x4096]

Per shape: the first call on a new thread after another thread has made the same call (the case of a
pipeline whose warm-up thread loaded the kernels), steady time per call (CUDA events, 50 calls), and the
max abs difference from the math backend (fp32). Prints a table.
"""
from __future__ import annotations

import argparse
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def efficient(q, k, v, mask, scale):
    b, h, m, _ = q.shape
    bias = mask.expand(b, h, m, mask.shape[-1])
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, 0.0, False, scale=scale)[0]


def sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def on_thread(fn, *args) -> float:
    out = []

    def run():
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.prefill_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="128x1024,512x1024,512x4096,2048x4096",
                    help="comma-separated SxL: prompt tokens x cache positions (default: llama-1b's sizes)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench.prefill_attention: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return
    dev = "cuda"
    hkv, g, d = 8, 4, 64
    rows = []
    for s, L in (tuple(map(int, shp.split("x"))) for shp in a.shapes.split(",")):
        q = torch.randn(1, hkv, g * s, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16)
        pos = L - s - 1
        qpos = pos + torch.arange(s, device=dev)
        allowed = (torch.arange(L, device=dev)[None, :] <= qpos[:, None]).repeat(g, 1)
        mask = torch.zeros((), dtype=torch.bfloat16, device=dev).where(allowed, torch.tensor(float("-inf"), dtype=torch.bfloat16, device=dev))
        scale = d ** -0.5
        with sdpa_kernel([SDPBackend.MATH]):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), scale=scale)
        for name, fn in (("sdpa (torch's choice)", sdpa), ("efficient (direct)", efficient)):
            first_other = on_thread(fn, q, k, v, mask, scale)
            first_new = on_thread(fn, q, k, v, mask, scale)
            fn(q, k, v, mask, scale)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(50):
                out = fn(q, k, v, mask, scale)
            e1.record()
            torch.cuda.synchronize()
            err = (out.float() - ref).abs().max().item()
            rows.append((s, L, name, 1000 * first_other, 1000 * first_new, 1000 * e0.elapsed_time(e1) / 50, err))
    print(f"{'S':>5} {'L':>5}  {'kernel':<22} {'1st thread ms':>13} {'2nd thread ms':>13} {'per call us':>11} {'max abs err':>11}")
    for s, L, name, a, b, c, e in rows:
        print(f"{s:5d} {L:5d}  {name:<22} {a:13.2f} {b:13.2f} {c:11.1f} {e:11.2e}")
    print("cudnn version", torch.backends.cudnn.version(), "priority", torch._C._get_sdp_priority_order())


if __name__ == "__main__":
    main()
