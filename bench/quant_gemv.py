"""Quantized matmuls on the GPU: the dequantizing GEMV of every type against bf16 cuBLAS on the same
shapes (µs per call inside a CUDA graph, achieved GB/s of weight bytes), the prefill paths (fused
dequantize-into-tl.dot vs dequantize-to-scratch + cuBLAS vs bf16 cuBLAS), an optional sweep of the GEMV
tuning, and end-to-end decode of a preset written by ``shapeplan quantize`` (late_steady tok/s, the
weight-bandwidth floor, weight memory vs the file's tensor bytes).

    python3 -m bench.quant_gemv                                    # GEMV table, llama-1b and 8b shapes
    python3 -m bench.quant_gemv --prefill-m 128,512,2048           # + the prefill paths
    python3 -m bench.quant_gemv --sweep --qtypes Q4_K,Q8_0         # + GEMV tuning (bn, warps, unroll)
    python3 -m bench.quant_gemv --e2e llama-1b:Q4_K_M,llama-1b:Q8_0,llama-8b:Q4_K_M --no-gemv

Without CUDA it says so and exits 0. Copy bandwidth for the floor: --copy-gbs (4,230 GB/s: the H200's
measured device-to-device copy).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

SHAPES = {"llama-1b": [(3072, 2048, "qkv"), (2048, 2048, "o"), (16384, 2048, "gate_up"), (2048, 8192, "down"),
                       (512, 2048, "k|v"), (128256, 2048, "head")],
          "llama-8b": [(6144, 4096, "qkv"), (4096, 4096, "o"), (28672, 4096, "gate_up"), (4096, 14336, "down"),
                       (1024, 4096, "k|v"), (128256, 4096, "head")]}


def graph_time(fn, reps: int = 20, rounds: int = 5) -> float:
    """µs per call of ``fn`` replayed ``reps`` times inside one CUDA graph (best of ``rounds``)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e6


def packed(name: str, n: int, k: int) -> torch.Tensor:
    from shapeplan.quant.quantize import quantize
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    return quantize(w, name)


def gemv_table(qtypes: list[str], presets: list[str], ms: list[int], prefill: list[int], sweep: bool) -> None:
    from shapeplan.quant.dequant import dequantize
    from shapeplan.quant.formats import QTYPES
    from shapeplan.runtime.backends.triton.kernels import gguf
    print(f"{'preset':<9} {'shape':<8} {'N x K':>14} {'type':<10} {'M':>3} {'path':<14} {'us':>8} {'GB/s':>7} "
          f"{'bf16 us':>8} {'x bf16':>6} {'max err':>8}")
    for preset in presets:
        for n, k, label in SHAPES[preset]:
            wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for name in qtypes:
                q = QTYPES[name]
                if k % q.block:
                    continue
                p = packed(name, n, k)
                w = dequantize(p, name).to(torch.bfloat16)
                for m in ms:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    us = graph_time(lambda: gguf.matmul(x, p, q, n, k))
                    ref_us = graph_time(lambda: x @ wb.t())
                    err = (gguf.matmul(x, p, q, n, k).float() - (x @ w.t()).float()).abs().max().item()
                    print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<10} {m:>3} {'gemv':<14} {us:>8.1f} "
                          f"{p.numel() / us / 1e3:>7.0f} {ref_us:>8.1f} {ref_us / us:>6.2f} {err:>8.1e}")
                    if sweep and m == ms[0]:
                        sweep_gemv(gguf, x, p, q, n, k)
                for m in prefill:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    ref_us = graph_time(lambda: x @ wb.t(), reps=5)
                    for path, fn in (("fused tl.dot", lambda: gguf.gemm(x, p, q, n, k)),
                                     ("dequant+cuBLAS", lambda: gguf.dequant_mm(x, p, q, n, k))):
                        us = graph_time(fn, reps=5)
                        print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<10} {m:>3} {path:<14} {us:>8.1f} "
                              f"{p.numel() / us / 1e3:>7.0f} {ref_us:>8.1f} {ref_us / us:>6.2f}")
                del p, w
            del wb
            torch.cuda.empty_cache()


def sweep_gemv(gguf, x, p, q, n: int, k: int) -> None:
    """Every GEMV tuning on one shape: prints a line per config and the best (for ``gguf.GEMV``)."""
    results = []
    for bn in (4, 8, 16, 32):
        for warps in (2, 4, 8):
            for unroll in (1, 2, 4):
                for split in (None, 1):
                    old = gguf.configure(gemv={"bn": bn, "warps": warps, "unroll": unroll})
                    try:
                        us = graph_time(lambda: gguf.gemv(x, p, q, n, k, split=split), reps=10, rounds=3)
                        results.append((us, bn, warps, unroll, split))
                    except Exception as e:  # noqa: BLE001 - e.g. out of registers: skip the config
                        print(f"    bn={bn} warps={warps} unroll={unroll}: {type(e).__name__}")
                    finally:
                        gguf.configure(*old)
    results.sort()
    for us, bn, warps, unroll, split in results[:5]:
        print(f"    sweep: bn={bn:<3} warps={warps} unroll={unroll} split={split or 'auto':<4} {us:8.1f} us "
              f"{p.numel() / us / 1e3:7.0f} GB/s")
    print(f"    BEST={results[0][1]},{results[0][2]},{results[0][3]},{results[0][4] or 'auto'}")


def e2e(specs: list[str], copy_gbs: float, new_tokens: int, prompt_len: int) -> None:
    """Decode tok/s of presets written by ``shapeplan quantize --preset`` and loaded back from the file."""
    from shapeplan.llm.bench import bench_prompt, load_model, run_config
    from shapeplan.quant.formats import QuantWeight
    from shapeplan.quant.writer import write_preset_gguf
    print(f"\n{'model':<18} {'config':<8} {'late tok/s':>10} {'decode':>8} {'MB/token':>9} {'floor tok/s':>11} "
          f"{'of floor':>8} {'weights MB':>10} {'file MB':>8} {'+mem':>6}")
    for spec in specs:
        preset, ftype = spec.split(":")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, f"{preset}-{ftype}.gguf")
            summary = write_preset_gguf(preset, path, ftype, device="cuda")
            torch.cuda.empty_cache()
            before = torch.cuda.memory_allocated()
            cfg, weights = load_model(None, path, "cuda", "bfloat16")
            mem = torch.cuda.memory_allocated() - before
            per_token = sum(w.nbytes for n, w in weights.items() if isinstance(w, QuantWeight)
                            and (n != "model.embed_tokens.weight" or cfg.tie_word_embeddings))
            file_mb = summary.bytes / 1e6
            for config in ("triton", "cuda_graphs"):
                row = run_config(cfg, weights, config, device="cuda", prompt=bench_prompt(cfg.vocab_size, prompt_len),
                                 new_tokens=new_tokens, max_kv_cache_length=1024, max_prefill_length=prompt_len)
                if not row.ok:
                    print(f"{spec:<18} {config:<8} FAILED: {row.error}")
                    continue
                floor = copy_gbs * 1e9 / per_token
                print(f"{spec:<18} {config:<8} {row.late_steady_tok_s:>10.1f} {row.decode_tok_s:>8.1f} "
                      f"{per_token / 1e6:>9.1f} {floor:>11.0f} {row.late_steady_tok_s / floor:>8.1%} "
                      f"{mem / 1e6:>10.1f} {file_mb:>8.1f} {mem / summary.bytes - 1:>6.1%}")
            del weights
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--qtypes", default="Q4_K,Q5_K,Q6_K,Q8_0,Q4_0,INT4_G64,INT8_G128",
                    help="comma-separated types (shapeplan/quant/formats.py)")
    ap.add_argument("--presets", default="llama-1b,llama-8b", help="whose matrix shapes to time")
    ap.add_argument("--m", default="1,4,8", help="GEMV rows (decode batch sizes)")
    ap.add_argument("--prefill-m", default="", help="prefill rows to time the fused and dequant+cuBLAS paths at")
    ap.add_argument("--sweep", action="store_true", help="sweep the GEMV tuning on each shape (slow)")
    ap.add_argument("--no-gemv", action="store_true", help="skip the kernel table")
    ap.add_argument("--e2e", default="", help="PRESET:FILETYPE,... end-to-end decode (e.g. llama-1b:Q4_K_M)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--copy-gbs", type=float, default=4230.0, help="copy bandwidth of the floor, GB/s")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_gemv: needs CUDA; measured nothing")
        return 0
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    if not a.no_gemv:
        gemv_table(a.qtypes.split(","), a.presets.split(","), ints(a.m), ints(a.prefill_m), a.sweep)
    if a.e2e:
        e2e(a.e2e.split(","), a.copy_gbs, a.new_tokens, a.prompt_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
