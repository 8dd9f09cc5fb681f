"""What a fresh process pays on first use of CUDA libraries (start-up probe; prints one line per step).

    python bench/gpu_first_use.py

Times, after the CUDA context exists: the first and second bf16 matmul of a few llama-1b prefill and
decode shapes, the first causal SDPA, the first CUDA graph capture, and a Python subprocess that only
imports Triton and computes its cache key (what a compile worker pays before its first job).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def timed(label: str, fn) -> None:  # noqa: ANN001
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    print(f"{label:<44} {1000 * (time.perf_counter() - t):8.2f} ms", flush=True)


def main() -> None:
    t = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    print(f"{'cuda context':<44} {1000 * (time.perf_counter() - t):8.2f} ms")
    bf = torch.bfloat16
    w1 = torch.randn(2048, 3072, device="cuda", dtype=bf)
    w2 = torch.randn(2048, 16384, device="cuda", dtype=bf)
    w3 = torch.randn(8192, 2048, device="cuda", dtype=bf)
    x32 = torch.randn(32, 2048, device="cuda", dtype=bf)
    x1 = torch.randn(1, 2048, device="cuda", dtype=bf)
    h32 = torch.randn(32, 8192, device="cuda", dtype=bf)
    timed("randn warm (elementwise)", lambda: torch.randn(8, device="cuda"))
    timed("matmul 32x2048 @ 2048x3072 first", lambda: x32 @ w1)
    timed("matmul 32x2048 @ 2048x3072 second", lambda: x32 @ w1)
    timed("matmul 32x2048 @ 2048x16384 first", lambda: x32 @ w2)
    timed("matmul 32x8192 @ 8192x2048 first", lambda: h32 @ w3)
    timed("matmul 1x2048 @ 2048x3072 first", lambda: x1 @ w1)
    timed("matmul 1x2048 @ 2048x3072 second", lambda: x1 @ w1)
    q = torch.randn(1, 32, 32, 64, device="cuda", dtype=bf)
    k = torch.randn(1, 32, 32, 64, device="cuda", dtype=bf)
    timed("sdpa causal 32 first", lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True))
    timed("sdpa causal 32 second", lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True))
    timed("rms_norm first", lambda: F.rms_norm(x32, (2048,)))
    timed("silu*mul first", lambda: F.silu(h32) * h32)

    def capture() -> None:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                x32 @ w1
        g.replay()
    timed("first CUDA graph capture + replay", capture)
    timed("second CUDA graph capture + replay", capture)
    with tempfile.TemporaryDirectory() as d:
        code = ("import time; t=time.perf_counter(); import triton; t1=time.perf_counter();"
                "from triton.compiler.compiler import triton_key; triton_key(); t2=time.perf_counter();"
                "from triton.backends.nvidia.driver import CudaUtils; CudaUtils(); t3=time.perf_counter();"
                "print(f'import {1e3*(t1-t):.0f} ms  key {1e3*(t2-t1):.0f} ms  driver helper {1e3*(t3-t2):.0f} ms')")
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        print(f"{'python -c pass':<44} {1000 * (time.perf_counter() - t):8.2f} ms")
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, TRITON_CACHE_DIR=d))
        print(f"{'triton worker start (cold cache)':<44} {1000 * (time.perf_counter() - t):8.2f} ms  "
              f"{r.stdout.strip()} {r.stderr.strip()[-200:]}")
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, TRITON_CACHE_DIR=d))
        print(f"{'triton worker start (warm cache)':<44} {1000 * (time.perf_counter() - t):8.2f} ms  "
              f"{r.stdout.strip()}")


if __name__ == "__main__":
    main()
