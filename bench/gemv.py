"""The fused decode GEMV (shapeplan/runtime/backends/triton/kernels/gemv.py) on the GPU, one row, bf16, on
each projection of a decoder as the LLM graph uses it (q/k/v and the LM head with the RMSNorm folded
in, gate/up with the norm and the SiLU gate, o and down with the residual add), against cuBLAS alone
and against what the fused kernel replaces (cuBLAS + the Triton norm / gate / add kernels). µs per call
inside a CUDA graph, with the weights rotated through enough copies that L2 (60 MB) holds none of them;
GB/s of weight bytes; the fused result's error relative to the unfused one. ``--sweep`` times every
(BN, BK, warps) on each shape, the committed tiles among them, launched as a decode step launches them
(programmatic dependent launch by ``SHAPEPLAN_LLM_GEMV_PDL``, on by default), and prints the best as
``gemv.TUNE`` lines.

    python3 -m bench.gemv                                  # llama-1b and llama-8b shapes, the tuned tiles
    python3 -m bench.gemv --presets llama-1b --sweep       # + the tile sweep (~2 min with compiles)
    python3 -m bench.gemv --pdl                            # + launched with programmatic dependent launch
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
from unittest import mock

import torch

from bench.quant_gemv import graph_time   # µs per call inside one CUDA graph, best of rounds

PRESETS = {"llama-1b": dict(h=2048, qkv=3072, f=8192, v=128256), "llama-8b": dict(h=4096, qkv=6144, f=14336, v=128256)}
SWEEP = list(itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048), (4, 8)))
L2_BYTES = 60e6
DEV = "cuda"


def roles(preset: str) -> list[tuple[str, int, int, dict]]:
    """(role, rows of W, K, how decode uses it)."""
    p = PRESETS[preset]
    h = p["h"]
    return [("qkv", p["qkv"], h, dict(norm=True)), ("o", h, h, dict(res=True)),
            ("gate_up", 2 * p["f"], h, dict(norm=True, glu=True)), ("down", h, p["f"], dict(res=True)),
            ("head", p["v"], h, dict(norm=True))]


def measure(preset: str, role: str, n: int, k: int, use: dict, sweep: bool, pdl: bool = False) -> dict:
    from shapeplan.runtime.backends.triton.kernels import gemv as G
    from shapeplan.runtime.backends.triton.kernels import rows as R
    dt = torch.bfloat16
    ws = [torch.randn(n, k, device=DEV, dtype=dt) * 0.02
          for _ in range(max(1, min(24, int(3 * L2_BYTES // (n * k * 2)))))]
    x = torch.randn(1, k, device=DEV, dtype=dt)
    nw = torch.rand(k, device=DEV, dtype=dt) + 0.5
    out_n = n // 2 if use.get("glu") else n
    r = torch.randn(1, out_n, device=DEV, dtype=dt)
    fk = dict(norm_w=nw if use.get("norm") else None, eps=1e-5, residual=r if use.get("res") else None,
              glu=bool(use.get("glu")))

    def unfused(w):
        xx = R.rms_norm(x, nw, 1e-5)[0] if use.get("norm") else x
        y = xx @ w.t()
        if use.get("glu"):
            y = R.silu_mul(*y.chunk(2, dim=-1))
        return r + y if use.get("res") else y

    per = len(ws)
    with mock.patch.dict(os.environ, {"SHAPEPLAN_LLM_GEMV_PDL": "0"}):    # the plain launches first
        row = {"preset": preset, "role": role, "n": n, "k": k, "copies": per,
               "cublas_us": graph_time(lambda: [x @ w.t() for w in ws]) / per,
               "unfused_us": graph_time(lambda: [unfused(w) for w in ws]) / per,
               "fused_us": graph_time(lambda: [G.gemv(x, w, **fk) for w in ws]) / per,
               "tiles": list(G.config(out_n, k))}
    if pdl:                           # the same launches with programmatic dependent launch (back to back)
        with mock.patch.dict(os.environ, {"SHAPEPLAN_LLM_GEMV_PDL": "1"}):
            row["pdl"] = G.pdl(x)
            row["fused_pdl_us"] = graph_time(lambda: [G.gemv(x, w, **fk) for w in ws]) / per
    ref = unfused(ws[0]).float()
    row["rel_err"] = ((G.gemv(x, ws[0], **fk).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    if sweep:               # launched as decode launches them (PDL by its switch), the committed tiles timed again
        committed = tuple(row["tiles"])
        best = (float("inf"), committed)
        for tiles in [committed] + [t for t in SWEEP if t != committed]:
            if tiles[1] > max(k, 512):
                continue
            try:
                t = graph_time(lambda: [G.gemv(x, w, tiles=tiles, **fk) for w in ws]) / per
            except Exception as e:  # noqa: BLE001 - e.g. out of resources: skip the config
                print(f"    {tiles}: {type(e).__name__}: {str(e)[:80]}")
                continue
            if tiles == committed:
                row["committed_sweep_us"] = t
            if t < best[0]:
                best = (t, tiles)
        row["best_us"], row["best_tiles"] = best[0], list(best[1])
    del ws
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.gemv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="llama-1b,llama-8b", help="whose shapes (llama-1b, llama-8b)")
    ap.add_argument("--roles", default="", help="only these projections (qkv, o, gate_up, down, head; default all)")
    ap.add_argument("--sweep", action="store_true", help="time every (BN, BK, warps); print TUNE lines")
    ap.add_argument("--pdl", action="store_true",
                    help="also time the fused GEMV launched with programmatic dependent launch (SHAPEPLAN_LLM_GEMV_PDL)")
    ap.add_argument("--json", dest="json_path", default=None, help="write the rows as JSON to this file")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.gemv: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; one row, bf16, µs per call in a CUDA graph")
    head = (f"{'preset':<9} {'role':<8} {'N x K':>14} {'cuBLAS':>8} {'unfused':>8} {'fused':>8} {'GB/s':>6} "
            f"{'tiles':>14} {'rel err':>8}" + (f" {'best':>8} {'best tiles':>14}" if a.sweep else "")
            + (f" {'+PDL':>8}" if a.pdl else ""))
    print(head)
    rows = []
    for preset in a.presets.split(","):
        for role, n, k, use in roles(preset):
            if a.roles and role not in a.roles.split(","):
                continue
            row = measure(preset, role, n, k, use, a.sweep, a.pdl)
            rows.append(row)
            line = (f"{preset:<9} {role:<8} {f'{n}x{k}':>14} {row['cublas_us']:8.2f} {row['unfused_us']:8.2f} "
                    f"{row['fused_us']:8.2f} {n * k * 2 / row['fused_us'] / 1e3:6.0f} {str(tuple(row['tiles'])):>14} "
                    f"{row['rel_err']:8.4f}")
            if a.sweep:
                line += (f" {row['best_us']:8.2f} {str(tuple(row['best_tiles'])):>14}"
                         f" (committed {row.get('committed_sweep_us', float('nan')):.2f})")
            if a.pdl:
                line += f" {row['fused_pdl_us']:8.2f}" + ("" if row["pdl"] else " (PDL unavailable)")
            print(line, flush=True)
    if a.sweep:
        print("\n# gemv.TUNE entries (N outputs, K) -> (BN, BK, warps):")
        for r in rows:
            out_n = r["n"] // 2 if r["role"] == "gate_up" else r["n"]
            print(f"    ({out_n}, {r['k']}): {tuple(r['best_tiles'])},   # {r['preset']} {r['role']} {r['best_us']:.2f} us")
    if a.json_path:
        with open(a.json_path, "w", encoding="utf-8") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
