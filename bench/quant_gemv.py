"""Quantized matmuls on the GPU: the dequantizing GEMV of every type against bf16 cuBLAS on the same
shapes (µs per call inside a CUDA graph, achieved GB/s of weight bytes), the prefill paths (fused
dequantize-into-tl.dot vs dequantize-to-scratch + cuBLAS vs bf16 cuBLAS), an optional sweep of the GEMV
tuning, and end-to-end decode of a preset written by ``shapeplan quantize`` (late_steady tok/s, the
weight-bandwidth floor, weight memory vs the file's tensor bytes).

    python3 -m bench.quant_gemv                                    # GEMV table, llama-1b and 8b shapes
    python3 -m bench.quant_gemv --prefill-m 128,512,2048           # + the prefill paths
    python3 -m bench.quant_gemv --sweep --qtypes Q4_K,Q8_0         # + GEMV tuning (bn, warps, unroll)
    python3 -m bench.quant_gemv --sweep1 --no-gemv                  # one-row Q4_K/Q5_K/Q6_K/Q8_0/Q4_0/IQ4 kernel tuning
    python3 -m bench.quant_gemv --no-gemv --gemm-sweep 16,64 --qtypes Q4_K_R,Q8_0_R   # the fused prefill GEMM's tiling
    python3 -m bench.quant_gemv --no-gemv --mmq-sweep 8,16 --qtypes Q4_K_R,Q6_K_R,Q8_0_R   # the integer GEMM's tiling
    python3 -m bench.quant_gemv --e2e llama-1b:Q4_K_M,llama-1b:Q8_0,llama-8b:Q4_K_M --no-gemv
    python3 -m bench.quant_gemv --no-gemv --sweep1 --shapes head --e2e llama-1b:Q4_K_M   # e2e with the swept tiles
    python3 -m bench.quant_gemv --no-gemv --sweep1 --stages 1,2,3 --qtypes Q4_K,Q6_K,Q8_0   # the K loop pipelined
    python3 -m bench.quant_gemv --no-gemv --e2e llama-1b:Q4_K_M --e2e-configs triton --pdl-ab 2   # PDL off/on A/B
    python3 -m bench.quant_gemv --no-gemv --e2e llama-8b:Q8_0 --e2e-configs triton --switch-ab SHAPEPLAN_QUANT_ATTN_X=off,auto
    python3 -m bench.quant_gemv --no-gemv --e2e llama-8b:Q4_K_M --e2e-configs triton --repack-ab 2  # file layout vs ours
    python3 -m bench.quant_gemv --qtypes Q4_K,Q4_K_R,Q6_K,Q6_K_R,Q8_0,Q8_0_R --m 1    # the one-row kernel on both layouts
    ncu --clock-control none -k regex:_q4k -c 1 python3 -m bench.quant_gemv --once llama-8b:gate_up:Q4_K  # counters

Without CUDA it says so and exits 0. Copy bandwidth for the floor: --copy-gbs; by default 4,230 GB/s on an
H200 (its measured device-to-device copy, the figure issue 19's targets use), elsewhere (an H100, say) a
device-to-device copy measured here and printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from unittest import mock

import torch

from shapeplan.llm.bench import copy_bandwidth, cuda_graph

SHAPES = {"llama-1b": [(3072, 2048, "qkv"), (2048, 2048, "o"), (16384, 2048, "gate_up"), (2048, 8192, "down"),
                       (512, 2048, "k|v"), (128256, 2048, "head"), (2560, 2048, "qk")],
          "llama-8b": [(6144, 4096, "qkv"), (4096, 4096, "o"), (28672, 4096, "gate_up"), (4096, 14336, "down"),
                       (1024, 4096, "k|v"), (128256, 4096, "head"), (5120, 4096, "qk")]}


def graph_time(fn, reps: int = 20, rounds: int = 5) -> float:
    """µs per call of ``fn`` replayed ``reps`` times inside one CUDA graph (best of ``rounds``)."""
    g = cuda_graph(fn, warmups=3, reps=reps)
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
    from shapeplan.runtime.backends.triton.kernels import gguf, mmq, qgemv
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
                    if m > 1 and qgemv.supports(x, p, name, k):     # "gemv" ran the one-row kernel, a program
                        us = graph_time(lambda: gguf.gemv(x, p, q, n, k))    # per row: beside it the generic
                        print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<10} {m:>3} {'generic gemv':<14} "
                              f"{us:>8.1f} {p.numel() / us / 1e3:>7.0f} {ref_us:>8.1f} {ref_us / us:>6.2f}")
                    if m > 1 and mmq.supports(x, p, name, k):       # the integer tensor-core GEMM (off by default)
                        us = graph_time(lambda: mmq.mmq(x, p, name, n, k))
                        err = (mmq.mmq(x, p, name, n, k).float() - (x @ w.t()).float()).abs().max().item()
                        print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<10} {m:>3} {'mmq':<14} {us:>8.1f} "
                              f"{p.numel() / us / 1e3:>7.0f} {ref_us:>8.1f} {ref_us / us:>6.2f} {err:>8.1e}")
                    if sweep and m == ms[0]:
                        sweep_gemv(gguf, x, p, q, n, k)
                for m in prefill:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    ref_us = graph_time(lambda: x @ wb.t(), reps=5)
                    paths = [("fused tl.dot", lambda: gguf.gemm(x, p, q, n, k)),
                             ("dequant+cuBLAS", lambda: gguf.dequant_mm(x, p, q, n, k))]
                    if mmq.supports(x, p, name, k):
                        paths.append(("mmq", lambda: mmq.mmq(x, p, name, n, k)))
                    for path, fn in paths:
                        us = graph_time(fn, reps=5)
                        print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<10} {m:>3} {path:<14} {us:>8.1f} "
                              f"{p.numel() / us / 1e3:>7.0f} {ref_us:>8.1f} {ref_us / us:>6.2f}")
                    if m <= 32 and qgemv.supports(x[:1], p, name, k):   # the one-row kernel a program per row
                        with mock.patch.object(qgemv, "MAX_ROWS", m):    # past its 8 (a probe of where it stops
                            us = graph_time(lambda: qgemv.gemv1(x, p, name, n, k), reps=5)      # paying)
                        print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<10} {m:>3} {'one-row rows':<14} "
                              f"{us:>8.1f} {p.numel() / us / 1e3:>7.0f} {ref_us:>8.1f} {ref_us / us:>6.2f}")
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
                    try:
                        with gguf.configured(gemv={"bn": bn, "warps": warps, "unroll": unroll}):
                            us = graph_time(lambda: gguf.gemv(x, p, q, n, k, split=split), reps=10, rounds=3)
                        results.append((us, bn, warps, unroll, split))
                    except Exception as e:  # noqa: BLE001 - e.g. out of registers: skip the config
                        print(f"    bn={bn} warps={warps} unroll={unroll}: {type(e).__name__}")
    results.sort()
    for us, bn, warps, unroll, split in results[:5]:
        print(f"    sweep: bn={bn:<3} warps={warps} unroll={unroll} split={split or 'auto':<4} {us:8.1f} us "
              f"{p.numel() / us / 1e3:7.0f} GB/s")
    print(f"    BEST={results[0][1]},{results[0][2]},{results[0][3]},{results[0][4] or 'auto'}")


def gemm_configs(m: int) -> list[tuple[int, int, int, int, int, int]]:
    """The fused prefill GEMM's tilings swept at ``m`` rows: (bm, bn, bk, warps, stages, swap); bm 16 or 32 (the
    rows rounded up) beside 64; bk 256 (a whole K-quant super-block per step) added after the first sweep, whose
    best bk was 64 or 128 on every shape; swap 1: the weight tile as the MMA's first operand (Hopper's warpgroup
    MMA then takes the bn weight rows as its M, where 16 x rows leave the plain order on the older MMA)."""
    bms = sorted({16 if m <= 16 else 32, 64})
    plain = [(bm, bn, bk, warps, stages, 0) for bm in bms
             for bn, bk in ((32, 128), (32, 256), (64, 64), (64, 128), (64, 256), (128, 64), (128, 128))
             for warps in (4, 8) for stages in (2, 3)]
    swapped = [(bm, bn, bk, warps, stages, 1) for bm in bms
               for bn, bk in ((64, 64), (64, 128), (64, 256), (128, 64), (128, 128)) for warps in (4, 8)
               for stages in (2, 3)]
    return plain + swapped


def _gemm_keys(tiles: tuple[int, ...]) -> dict:
    return dict(zip(("bm", "bn", "bk", "warps", "stages", "swap"), tiles))


def _precompile_tilings(task: tuple) -> int:
    """Child process of ``sweep_gemm`` / ``sweep_mmq`` (``kind`` "gemm" / "mmq"): compile one type's kernel in
    each tiling, whole and split along K (their PARTIAL variants), on a small matrix."""
    kind, name, configs = task
    from shapeplan.quant.formats import QTYPES
    from shapeplan.runtime.backends.triton.kernels import gguf, mmq
    n, k = 256, 2048
    w, x, done = packed(name, n, k), torch.randn(16, k, device="cuda", dtype=torch.bfloat16), 0
    for tiles in configs:
        for split in (1, 2):
            try:
                if kind == "gemm":
                    with gguf.configured(gemm={**_gemm_keys(tiles), "split": split}):
                        gguf.gemm(x, w, QTYPES[name], n, k)
                else:
                    with mock.patch.dict(mmq.MMQ, {**_mmq_keys(tiles), "split": split, "by_type": {}}):
                        mmq.mmq(x[:8], w, name, n, k)
                done += 1
            except Exception:  # noqa: BLE001 - reported by the timing loop
                pass
    torch.cuda.synchronize()
    return done


def _precompile_all(kind: str, tasks: list[tuple], jobs: int) -> None:
    import multiprocessing as mp
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(jobs) as pool:
        done = pool.map(_precompile_tilings, [(kind, *t) for t in tasks], chunksize=1)
    print(f"# compiled {sum(done)} {kind} variants in {time.perf_counter() - t0:.0f} s ({jobs} processes)", flush=True)


def _tally(sums: dict, m: int, name: str, results: list[tuple[float, tuple]]) -> None:
    """Add one shape's timings (µs, tiling) at ``m`` rows to ``sums``, per type and over all types."""
    for us, tiles in results:
        for group in ("all types", name):
            row = sums.setdefault((m, group, tiles), {"us": 0.0, "cases": 0})
            row["us"] += us
            row["cases"] += 1


def _print_ranked(sums: dict, ms: list[int], qtypes: list[str], committed, what: str) -> None:
    """Per row count and group, the tilings that ran on every shape, by their summed time (five, and the
    committed one ``committed(m, group)`` if it is not among them)."""
    for m in ms:
        for group in ("all types", *qtypes):
            now = committed(m, group)
            rows = {t: v for (mm, g, t), v in sums.items() if mm == m and g == group}
            if not rows:
                continue
            full = max(v["cases"] for v in rows.values())       # a tiling that failed somewhere is not ranked
            ranked = sorted(((v["us"], t) for t, v in rows.items() if v["cases"] == full), key=lambda r: r[0])
            print(f"\n# M={m}, {group}: {what} by their time summed over the shapes (committed {now}):")
            for us, tiles in ranked[:5] + [r for r in ranked[5:] if r[1] == now][:1]:
                print(f"    {tiles}  {us:9.1f} us" + ("  (committed)" if tiles == now else ""))


def sweep_gemm(qtypes: list[str], presets: list[str], ms: list[int], jobs: int, labels: list[str] | None = None,
               top: int = 3) -> None:
    """Every tiling of ``gemm_configs`` of the fused prefill GEMM (its split along K by its own rule) on each
    shape at each of ``ms`` rows, beside the committed tiling, dequantize + cuBLAS and bf16 cuBLAS on the same
    shape (what the quantized path has to beat); then, per row count, the
    tilings ranked by their time summed over the shapes (the candidates for ``gguf.GEMM``)."""
    from shapeplan.quant.formats import QTYPES
    from shapeplan.runtime.backends.triton.kernels import gguf

    def committed(m: int, group: str = "") -> tuple[int, ...]:
        bm = gguf.gemm_bm(m)
        return (bm, *(gguf.GEMM[key] for key in ("bn", "bk", "warps", "stages")), int(gguf.gemm_swap(bm)))

    if jobs > 1:
        _precompile_all("gemm", [(name, [c]) for name in qtypes for c in sorted({c for m in ms for c in gemm_configs(m)})],
                        jobs)
    sums: dict[tuple, dict] = {}
    for preset in presets:
        for n, k, label in SHAPES[preset]:
            if labels and label not in labels and f"{preset}:{label}" not in labels:
                continue
            wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for name in qtypes:
                q = QTYPES[name]
                p = packed(name, n, k)
                for m in ms:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    deq = graph_time(lambda: gguf.dequant_mm(x, p, q, n, k), reps=5, rounds=3)
                    bf16 = graph_time(lambda: x @ wb.t(), reps=5, rounds=3)
                    results, now = [], committed(m)
                    for tiles in gemm_configs(m) + ([] if now in gemm_configs(m) else [now]):
                        try:
                            with gguf.configured(gemm=_gemm_keys(tiles)):
                                us = graph_time(lambda: gguf.gemm(x, p, q, n, k), reps=5, rounds=3)
                            results.append((us, tiles))
                        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip the tiling
                            print(f"    {tiles}: {type(e).__name__}: {str(e)[:80]}")
                    results.sort()
                    cur = next((us for us, t in results if t == now), float("nan"))
                    print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<7} M={m:<4} dequant+cuBLAS {deq:8.1f} us | "
                          f"committed {now} {cur:8.1f} us | bf16 cuBLAS {bf16:8.1f} us", flush=True)
                    for us, tiles in results[:top]:
                        print(f"    bm={tiles[0]:<3} bn={tiles[1]:<4} bk={tiles[2]:<4} warps={tiles[3]} stages={tiles[4]} "
                              f"swap={tiles[5]} {us:8.1f} us  x{deq / us:5.2f} vs dequant")
                    _tally(sums, m, name, results)
                del p
            del wb
            torch.cuda.empty_cache()
    _print_ranked(sums, ms, qtypes, committed, "tilings")


#: the integer GEMM's tilings swept: split None is gguf.py's rule (split only where the output tiles leave SMs idle:
#: llama-8b gate/up's 448 tiles of 64 rows are not split, 3.4 programs an SM), 2-8 split every shape along K
MMQ_CONFIGS = [(bn, warps, stages, split) for bn in (32, 64, 128) for warps in (4,) for stages in (2, 3)
               for split in (None, 2, 4, 8)]


def _mmq_keys(tiles: tuple) -> dict:
    return dict(zip(("bn", "warps", "stages", "split"), tiles))


def sweep_mmq(qtypes: list[str], presets: list[str], ms: list[int], jobs: int, labels: list[str] | None = None,
              top: int = 3) -> None:
    """Every tiling of ``MMQ_CONFIGS`` of the integer tensor-core GEMM (mmq.py: bn, warps, stages, split along K:
    None = its rule) on each shape at each of ``ms`` rows, beside the committed tiling, the one-row
    kernels' per-row programs (up to 8 rows) or the fused GEMM (above: ``gguf.matmul``) and bf16 cuBLAS; then,
    per row count and type, the tilings ranked by their time summed over the shapes (the candidates for
    ``mmq.MMQ``)."""
    from shapeplan.quant.formats import QTYPES
    from shapeplan.runtime.backends.triton.kernels import gguf, mmq

    def committed(name: str) -> tuple:
        return tuple(mmq.tiling(name)[key] for key in ("bn", "warps", "stages", "split"))

    configs = MMQ_CONFIGS + sorted({committed(name) for name in qtypes} - set(MMQ_CONFIGS), key=str)
    if jobs > 1:
        _precompile_all("mmq", [(name, [c]) for name in qtypes for c in configs], jobs)
    sums: dict[tuple, dict] = {}
    for preset in presets:
        for n, k, label in SHAPES[preset]:
            if labels and label not in labels and f"{preset}:{label}" not in labels:
                continue
            wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            for name in qtypes:
                p = packed(name, n, k)
                for m in ms:
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    other = graph_time(lambda: gguf.matmul(x, p, QTYPES[name], n, k), reps=5, rounds=3)
                    bf16 = graph_time(lambda: x @ wb.t(), reps=5, rounds=3)
                    results = []
                    for tiles in configs:
                        try:
                            with mock.patch.dict(mmq.MMQ, {**_mmq_keys(tiles), "by_type": {}}):
                                us = graph_time(lambda: mmq.mmq(x, p, name, n, k), reps=5, rounds=3)
                            results.append((us, tiles))
                        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip the tiling
                            print(f"    {tiles}: {type(e).__name__}: {str(e)[:80]}")
                    results.sort(key=lambda r: r[0])
                    now = committed(name)
                    cur = next((us for us, t in results if t == now), float("nan"))
                    print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<7} M={m:<4} without mmq {other:8.1f} us | "
                          f"committed {now} {cur:8.1f} us | bf16 cuBLAS {bf16:8.1f} us", flush=True)
                    for us, tiles in results[:top]:
                        print(f"    bn={tiles[0]:<4} warps={tiles[1]} stages={tiles[2]} split={tiles[3]} {us:8.1f} us")
                    _tally(sums, m, name, results)
                del p
            del wb
            torch.cuda.empty_cache()
    _print_ranked(sums, ms, qtypes, lambda m, group: committed(group) if group in mmq.TYPES else None,
                  "mmq tilings")


#: how decode uses each shape: the one-row kernel's prologue / epilogue there (qgemv.py)
#: how decode calls each shape ("qk": q and k stacked without v, Q4_K_M's mixed layers; "k|v": the float path's)
USE = {"qkv": "norm", "o": "res", "gate_up": "norm+glu", "down": "res", "k|v": "plain", "head": "norm", "qk": "norm"}
SWEEP1 = [(bn, ch, warps, xq) for bn in (1, 2, 4, 8, 16, 32) for ch in (1, 2, 4, 8, 16) for warps in (1, 2, 4, 8)
          for xq in (1, 0, 2, 3)]
#: elements of K per CH step of each kernel (a super-block, a pair of super-blocks, a pair of blocks)
CH_ELEMS = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 512, "Q8_0": 64, "Q4_0": 64, "IQ4_NL": 64, "IQ4_XS": 64}
L2_BYTES = 60e6


def _base(name: str) -> str:
    """The GGUF type whose kernel (and tile family) a type runs: our layouts Q4_K_R / Q8_0_R run Q4_K's / Q8_0's."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    return qgemv.TUNED_AS.get(name, name)


def sweep1_configs(name: str, out_n: int, modes: tuple[int, ...] = (1, 0, 2, 3)) -> list[tuple[int, int, int, int]]:
    """The (BN, CH, warps, XQ) worth timing: 16..128 weight elements per thread per iteration (32..256 for
    the 4-bit codes Q8_0's kernel runs: the same bytes in flight; CH 8 and 16, the long rows' many chunks per
    iteration, only with more than one warp), at least 64 rows per BN (fewer programs than that leave SMs
    idle), x modes ``modes``."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    per = 2 if name in qgemv.NIBBLES else 1
    return [t for t in SWEEP1 if 16 * per <= t[0] * t[1] * CH_ELEMS[_base(name)] / (32 * t[2]) <= 128 * per
            and t[0] <= max(1, out_n // 64) and t[3] in modes and (t[1] <= 4 or t[2] > 1)
            and (t[3] < 3 or _base(name) == "Q4_K")]


def staged_configs(name: str, out_n: int, current: tuple[int, ...], stages: tuple[int, ...],
                   pfs: tuple[int, ...] = (0,)) -> list[tuple[int, ...]]:
    """``--stages``: small tiles (BN, CH <= 4, 1-2 warps, 16..64 weight elements per thread per iteration:
    the pipeliner keeps the rest in flight) in the current tile's x mode, and the current tile, each at
    every stage count of ``stages`` (and, Q4_K, with and without the register prefetch: ``pfs``)."""
    base = [t for t in SWEEP1 if t[0] <= 4 and t[1] <= 4 and t[2] <= 2 and t[3] == current[3]
            and 16 <= t[0] * t[1] * CH_ELEMS[_base(name)] / (32 * t[2]) <= 64 and t[0] <= max(1, out_n // 64)]
    base += [tuple(current[:4])] if tuple(current[:4]) not in base else []
    return [(*t, st, pf) if pf else (*t, st) for t in base for st in stages
            for pf in (pfs if _base(name) == "Q4_K" else (0,))]


def _configs(name: str, out_n: int, k: int, modes: tuple[int, ...], stages: tuple[int, ...],
             pfs: tuple[int, ...] = (0,)) -> list[tuple[int, ...]]:
    from shapeplan.runtime.backends.triton.kernels import qgemv
    if stages:
        return staged_configs(name, out_n, qgemv.config(name, out_n, k), stages, pfs)
    family = sweep1_configs(name, out_n, modes)
    if _base(name) != "Q4_K" or tuple(pfs) == (0,):
        return family
    # Q4_K's register prefetch on the whole family (not in the integer-dot kernel, XQ = 3)
    return [(*t, 1, pf) if pf else t for t in family for pf in pfs if not pf or t[3] < 3]


def _sweep1_case(name: str, n: int, k: int, use: str):
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    s = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    out_n = n // 2 if "glu" in use else n
    r = torch.randn(1, out_n, device="cuda", dtype=torch.bfloat16)
    return x, out_n, dict(norm_w=s if "norm" in use else None, eps=1e-5, residual=r if use == "res" else None,
                          glu="glu" in use)


def _precompile(task: tuple) -> int:
    """Child process of the sweep: compile (one launch each) every config of one shape and type, so the
    timing loop finds Triton's cache warm."""
    name, n, k, use, modes, stages, pfs = task
    from shapeplan.runtime.backends.triton.kernels import qgemv
    w = packed(name, n, k)
    x, out_n, kw = _sweep1_case(name, n, k, use)
    done = 0
    for tiles in _configs(name, out_n, k, modes, stages, pfs):
        try:
            qgemv.gemv1(x, w, name, n, k, tiles=tiles, **kw)
            done += 1
        except Exception:  # noqa: BLE001 - reported by the timing loop
            pass
    torch.cuda.synchronize()
    return done


def sweep_one_row(qtypes: list[str], presets: list[str], top: int, jobs: int, labels: list[str] | None = None,
                  modes: tuple[int, ...] = (1, 0, 2, 3), stages: tuple[int, ...] = (),
                  pfs: tuple[int, ...] = (0,)) -> dict[tuple[str, int, int], tuple[int, ...]]:
    """Every (BN, CH, warps, XQ) of qgemv.py's one-row kernel on each decode shape (x modes ``modes``),
    used as decode uses it (``USE``), weights rotated through enough copies to exceed L2; prints the best
    configs per shape, the shape's current config (``qgemv.config``), the generic GEMV and bf16 cuBLAS
    for comparison, and ``TUNE`` lines (the best of the swept and the current) to paste into qgemv.py; returns
    them as ``TUNE`` entries. ``jobs`` processes compile the configs first (Triton compiles one kernel at a
    time per process).
    ``stages``: the staged family instead (``staged_configs``: tiles (BN, CH, warps, XQ, STAGES))."""
    import multiprocessing as mp
    from shapeplan.quant.formats import QTYPES
    from shapeplan.runtime.backends.triton.kernels import gguf, qgemv
    cases = [(preset, n, k, label, name) for preset in presets for n, k, label in SHAPES[preset]
             for name in qtypes if name in qgemv.K_MULTIPLE and k % qgemv.K_MULTIPLE[name] == 0
             and (not labels or label in labels or f"{preset}:{label}" in labels)]
    if jobs > 1:
        t0 = time.perf_counter()
        with mp.get_context("spawn").Pool(jobs) as pool:
            tasks = [(name, n, k, USE[label], modes, stages, pfs) for _, n, k, label, name in cases]
            done = pool.map(_precompile, tasks, chunksize=1)
        print(f"# compiled {sum(done)} kernel configs in {time.perf_counter() - t0:.0f} s ({jobs} processes)",
              flush=True)
    best_lines, best = [], {}
    for preset, n, k, label, name in cases:
        use = USE[label]
        one = packed(name, n, k)
        copies = [one] + [one.clone() for _ in range(max(1, int(3 * L2_BYTES / one.numel())))]
        x, out_n, kw = _sweep1_case(name, n, k, use)
        i = [0]

        def nxt():
            i[0] = (i[0] + 1) % len(copies)
            return copies[i[0]]

        results = []
        current = qgemv.config(name, out_n, k)
        configs = _configs(name, out_n, k, modes, stages, pfs)
        now = qgemv.full_tiles(current)
        for tiles in configs + ([] if now in map(qgemv.full_tiles, configs) else [current]):
            try:
                us = graph_time(lambda: qgemv.gemv1(x, nxt(), name, n, k, tiles=tiles, **kw),
                                reps=len(copies) * 2, rounds=3)
                results.append((us, tiles))
            except Exception as e:  # noqa: BLE001 - e.g. out of resources: skip the config
                print(f"    {tiles}: {type(e).__name__}: {str(e)[:80]}")
        results.sort()
        generic = graph_time(lambda: gguf.gemv(x, nxt(), QTYPES[name], n, k), reps=len(copies) * 2, rounds=3)
        wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, int(3 * L2_BYTES / (n * k * 2))))]
        j = [0]

        def nxt_b():
            j[0] = (j[0] + 1) % len(wb)
            return wb[j[0]]

        bf16 = graph_time(lambda: x @ nxt_b().t(), reps=len(wb) * 2, rounds=3)
        gb = lambda us: one.numel() / us / 1e3  # noqa: E731
        print(f"{preset:<9} {label:<8} {f'{n}x{k}':>14} {name:<5} {use:<9} generic {generic:7.1f} us "
              f"{gb(generic):5.0f} GB/s | bf16 cuBLAS {bf16:7.1f} us | {len(copies)} copies", flush=True)
        shown = results[:top]
        cur = [r for r in results if qgemv.full_tiles(r[1]) == now]
        for us, tiles in shown + [r for r in cur if r not in shown][:1]:
            st = (f" stages={tiles[4]}" if len(tiles) > 4 else "") + (f" pf={tiles[5]}" if len(tiles) > 5 else "")
            print(f"    bn={tiles[0]:<3} ch={tiles[1]} warps={tiles[2]} xq={tiles[3]}{st}  {us:8.1f} us "
                  f"{gb(us):6.0f} GB/s x{generic / us:5.2f} generic"
                  + ("  (current)" if qgemv.full_tiles(tiles) == now else ""))
        if results:
            us, tiles = results[0]
            best[(name, out_n, k)] = tiles
            best_lines.append(f'    ("{name}", {out_n}, {k}): {tiles},   # {preset} {label}: {us:.1f} us, '
                              f'{gb(us):.0f} GB/s')
        del copies, one, wb
        torch.cuda.empty_cache()
    print("\n# qgemv.TUNE entries (best per shape; this run's --e2e uses them):\nTUNE = {")
    print("\n".join(best_lines))
    print("}")
    return best


def e2e(specs: list[str], copy_gbs: float, new_tokens: int, prompt_len: int, configs: list[str],
        profile_tokens: int = 0, switch_ab: tuple[str, list[str], int] | None = None, repack_rounds: int = 0,
        swept: dict | None = None, tiles_rounds: int = 0) -> None:
    """Decode tok/s of presets written by ``shapeplan quantize --preset`` and loaded back from the file;
    ``profile_tokens``: then the per-kernel table of the last config's decode (bench/decode.py);
    ``switch_ab`` (NAME, values, rounds): each config that many rounds with the switch at each value, interleaved
    (one model load; each row builds its graph and captures its own plans, so a graph or kernel switch applies
    to it: e.g. SHAPEPLAN_QUANT_GEMV_PDL 0 / 1, SHAPEPLAN_QUANT_ATTN_X off / auto);
    ``repack_rounds``: the same with ``SHAPEPLAN_QUANT_REPACK`` (applied at load: the model is loaded twice,
    in the file's layout and with Q4_K / Q8_0 as Q4_K_R / Q8_0_R, and the rows alternate between the two);
    ``swept``: ``qgemv.TUNE`` entries (a ``--sweep1`` of this run) every row uses, or with ``tiles_rounds`` the
    rows alternate between the committed tiles and these."""
    from shapeplan.llm.bench import bench_prompt, load_model, run_config
    from shapeplan.quant.formats import QuantWeight
    from shapeplan.quant.writer import write_preset_gguf
    from shapeplan.runtime.backends.triton.kernels import qgemv
    print(f"\n{'model':<18} {'config':<8} {'late tok/s':>10} {'decode':>8} {'MB/token':>9} {'floor tok/s':>11} "
          f"{'of floor':>8} {'weights MB':>10} {'file MB':>8} {'+mem':>6}")
    for spec in specs:
        preset, ftype = spec.split(":")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, f"{preset}-{ftype}.gguf")
            summary = write_preset_gguf(preset, path, ftype, device="cuda")
            torch.cuda.empty_cache()
            loads = {}                                  # SHAPEPLAN_QUANT_REPACK value (None: as set) -> model
            for repack in (["0", "1"] if repack_rounds else [None]):
                before = torch.cuda.memory_allocated()
                with mock.patch.dict(os.environ, {} if repack is None else {"SHAPEPLAN_QUANT_REPACK": repack}):
                    cfg, weights = load_model(None, path, "cuda", "bfloat16")
                loads[repack] = cfg, weights, torch.cuda.memory_allocated() - before
            file_mb = summary.bytes / 1e6
            ab_name, ab_values, ab_rounds = switch_ab or ("", [], 0)
            runs = [(c, sw, rp, tl) for c in configs for sw in (ab_values * ab_rounds or [None])
                    for rp in (["0", "1"] * repack_rounds or [None])
                    for tl in (["committed", "swept"] * tiles_rounds or [None])]
            for config, sw, rp, tl in runs:
                cfg, weights, mem = loads[rp]
                per_token = sum(w.nbytes for n, w in weights.items() if isinstance(w, QuantWeight)
                                and (n != "model.embed_tokens.weight" or cfg.tie_word_embeddings))
                with mock.patch.dict(os.environ, {} if sw is None else {ab_name: sw}), \
                        mock.patch.dict(qgemv.TUNE, {} if tl == "committed" else swept or {}):
                    row = run_config(cfg, weights, config, device="cuda", prompt=bench_prompt(cfg.vocab_size, prompt_len),
                                     new_tokens=new_tokens, max_kv_cache_length=1024, max_prefill_length=prompt_len)
                label = (config + ("" if sw is None else f"/{sw}") + ("" if rp is None else f"/repack{rp}")
                         + ("" if tl is None else f"/{tl}"))
                if not row.ok:
                    print(f"{spec:<18} {label:<8} FAILED: {row.error}")
                    continue
                floor = copy_gbs * 1e9 / per_token
                print(f"{spec:<18} {label:<8} {row.late_steady_tok_s:>10.1f} {row.decode_tok_s:>8.1f} "
                      f"{per_token / 1e6:>9.1f} {floor:>11.0f} {row.late_steady_tok_s / floor:>8.1%} "
                      f"{mem / 1e6:>10.1f} {file_mb:>8.1f} {mem / summary.bytes - 1:>6.1%}")
            if profile_tokens:
                from bench.decode import profile
                cfg, weights, _ = loads[None if not repack_rounds else "1"]
                with mock.patch.dict(qgemv.TUNE, swept or {}):
                    profile(cfg, weights, configs[-1], prompt_len=prompt_len, max_kv_cache_length=1024,
                            tokens=profile_tokens, rows=30, dtype=cfg.torch_dtype)
            del weights, loads
            torch.cuda.empty_cache()


def once(spec: str, calls: int = 3) -> None:
    """``--once PRESET:LABEL:QTYPE[:TILES]``: the one-row kernel of one decode shape called ``calls`` times and
    nothing else, for a profiler to attach to (``ncu -k regex:_q4k ... python3 -m bench.quant_gemv --no-gemv
    --once llama-8b:gate_up:Q4_K``: bench/README.md). The weight is random words: the kernel's instructions
    and loads do not depend on the values. TILES: BN/CH/warps/XQ[/STAGES[/PF]] instead of ``qgemv.config``'s."""
    from shapeplan.quant.formats import QTYPES
    from shapeplan.runtime.backends.triton.kernels import qgemv
    preset, label, name, *tiles = spec.split(":")
    n, k = next((n, k) for n, k, lab in SHAPES[preset] if lab == label)
    w = torch.randint(0, 256, (n, QTYPES[name].row_bytes(k)), dtype=torch.uint8, device="cuda")
    x, out_n, kw = _sweep1_case(name, n, k, USE[label])
    t = tuple(int(v) for v in tiles[0].split("/")) if tiles else qgemv.config(name, out_n, k)
    for _ in range(calls):
        qgemv.gemv1(x, w, name, n, k, tiles=t, **kw)
    torch.cuda.synchronize()
    print(f"once: {preset} {label} {n}x{k} {name} tiles {t}, {calls} calls")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--qtypes", default="Q4_K,Q5_K,Q6_K,Q8_0,Q4_0,INT4_G64,INT8_G128",
                    help="comma-separated types (shapeplan/quant/formats.py)")
    ap.add_argument("--presets", default="llama-1b,llama-8b", help="whose matrix shapes to time")
    ap.add_argument("--m", default="1,4,8", help="GEMV rows (decode batch sizes)")
    ap.add_argument("--prefill-m", default="", help="prefill rows to time the fused and dequant+cuBLAS paths at")
    ap.add_argument("--sweep", action="store_true", help="sweep the GEMV tuning on each shape (slow)")
    ap.add_argument("--sweep1", action="store_true",
                    help="sweep the one-row Q4_K/Q5_K/Q6_K/Q8_0/Q4_0/IQ4 kernel (qgemv.py: BN x CH x warps x XQ) "
                    "on each decode shape")
    ap.add_argument("--shapes", default="", help="--sweep1 only these shapes: labels of SHAPES (qkv,o,gate_up,...), or PRESET:LABEL")
    ap.add_argument("--top", type=int, default=3, help="configs printed per shape by --sweep1")
    ap.add_argument("--xq", default="1,0,2,3",
                    help="--sweep1 only these x modes (qgemv.py: 1 quads, 0 tile, 2 int8 codes, 3 int8 codes with "
                    "integer dots: Q4_K)")
    ap.add_argument("--stages", default="", help="--sweep1 the staged family instead: small tiles in the current "
                    "x mode at these K-loop stage counts (qgemv.py STAGES), e.g. 1,2,3")
    ap.add_argument("--pf", default="0",
                    help="Q4_K's register prefetch off / on (qgemv.py PF) in --sweep1's family (with --stages: "
                    "the staged family's), e.g. 0,1")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                    help="processes compiling --sweep1's kernels before it times them")
    ap.add_argument("--gemm-sweep", default="", metavar="M,...",
                    help="sweep the fused prefill GEMM's tiling (gguf.GEMM: bm, bn, bk, warps, stages, swap) at these rows on "
                    "each shape (--shapes narrows it), against the committed tiling and dequantize + cuBLAS")
    ap.add_argument("--mmq-sweep", default="", metavar="M,...",
                    help="sweep the integer tensor-core GEMM's tiling (mmq.MMQ: bn, warps, stages, split) at these rows "
                    "on each shape (--shapes narrows it), against the committed tiling and the path without it")
    ap.add_argument("--no-gemv", action="store_true", help="skip the kernel table")
    ap.add_argument("--e2e", default="", help="PRESET:FILETYPE,... end-to-end decode (e.g. llama-1b:Q4_K_M)")
    ap.add_argument("--e2e-configs", default="triton,cuda_graphs", help="modes of the --e2e rows")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after each --e2e model, a per-kernel table of its decode over N tokens")
    ap.add_argument("--pdl-ab", type=int, default=0, metavar="R",
                    help="each --e2e config R times with SHAPEPLAN_QUANT_GEMV_PDL=off and =on, interleaved (one model load)")
    ap.add_argument("--switch-ab", default="", metavar="NAME=A,B[:R]",
                    help="each --e2e config R (default 2) times with the switch NAME at each value, interleaved, e.g. "
                    "SHAPEPLAN_QUANT_ATTN_X=off,auto")
    ap.add_argument("--repack-ab", type=int, default=0, metavar="R",
                    help="each --e2e config R times with the model loaded in the file's layout and with Q4_K / Q8_0 "
                    "as Q4_K_R / Q8_0_R (SHAPEPLAN_QUANT_REPACK=0 / 1: two loads), interleaved")
    ap.add_argument("--once", default="", metavar="PRESET:LABEL:QTYPE[:TILES]",
                    help="only call one shape's one-row kernel a few times (for ncu), e.g. llama-8b:gate_up:Q4_K")
    ap.add_argument("--tiles-ab", type=int, default=0, metavar="R",
                    help="after --sweep1: each --e2e config R times on the committed tiles and on the swept ones, "
                    "interleaved (one model load); without it the --e2e rows use the swept tiles")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--copy-gbs", type=float, default=None,
                    help="copy bandwidth of the floor, GB/s (default: 4,230 on an H200, else measured here)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_gemv: needs CUDA; measured nothing")
        return 0
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    if a.once:
        once(a.once)
        return 0
    if not a.no_gemv:
        gemv_table(a.qtypes.split(","), a.presets.split(","), ints(a.m), ints(a.prefill_m), a.sweep)
    swept = {}
    if a.sweep1:
        swept = sweep_one_row(a.qtypes.split(","), a.presets.split(","), a.top, a.jobs,
                              [s for s in a.shapes.split(",") if s], tuple(int(m) for m in a.xq.split(",")),
                              tuple(ints(a.stages)), tuple(ints(a.pf)))
    if a.gemm_sweep:
        sweep_gemm(a.qtypes.split(","), a.presets.split(","), ints(a.gemm_sweep), a.jobs,
                   [s for s in a.shapes.split(",") if s], a.top)
    if a.mmq_sweep:
        sweep_mmq(a.qtypes.split(","), a.presets.split(","), ints(a.mmq_sweep), a.jobs,
                  [s for s in a.shapes.split(",") if s], a.top)
    if a.e2e:
        ab = ("SHAPEPLAN_QUANT_GEMV_PDL", ["off", "on"], a.pdl_ab) if a.pdl_ab else None
        if a.switch_ab:
            name, _, rest = a.switch_ab.partition("=")
            values, _, rounds = rest.partition(":")
            ab = (name, values.split(","), int(rounds or 2))
        e2e(a.e2e.split(","), a.copy_gbs or copy_bandwidth() / 1e9, a.new_tokens, a.prompt_len,
            a.e2e_configs.split(","), a.profile, ab, a.repack_ab, swept, a.tiles_ab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
