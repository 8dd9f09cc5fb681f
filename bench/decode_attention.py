"""Decode attention on the GPU: the Triton split-K kernel's variants (split, warps, dot) against SDPA over
the whole static cache, at the llama-1b / 8b head layout (32 query heads, 8 KV heads, head dim 64,
bf16). Per variant: max error vs SDPA and time per call inside a CUDA graph of one call per layer (16
separate caches). Prints a table, then ``BEST=split,warps,dot`` (the fastest variant within the bf16
tolerance), a value for SHAPEPLAN_DECODE_ATTN. With ``--paged``: the paged KV cache's decode kernel
(``kernels/paged.py``, what the serving core runs) instead, at batch 1 as a decode step calls it (this
step's k/v written, q rotated from the rotary tables), over its tiling (merge chunk, warps, most splits
per head, form: see ``PAGED_VARIANTS``) at llama-1b's and llama-8b's head dims, against SDPA over the live keys;
``PAGED_BEST`` lines name the fastest tiling per head dim.

    python3 -m bench.decode_attention --pos 256
    python3 -m bench.decode_attention --paged --pos 128,384
"""
from __future__ import annotations

import argparse
from unittest import mock

import torch

from shapeplan.llm.bench import cuda_graph
from shapeplan.ops import llm as llm_ops
from shapeplan.runtime.backends.triton.kernels import decode_attention as da

VARIANTS = [(64, 4, False), (32, 2, False), (32, 4, False), (128, 4, False), (16, 2, False),
            (16, 4, True), (32, 4, True), (64, 4, True), (32, 2, True), (64, 2, True), (128, 4, True)]


def timed(fn, layers: int) -> float:
    """µs per call: ``fn`` makes ``layers`` calls; median of 7 rounds of 20 replays of its CUDA graph."""
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
        ts.append(e0.elapsed_time(e1) * 1e3 / (20 * layers))
    return sorted(ts)[len(ts) // 2]


#: (merge chunk, warps, most splits per head, form) of the paged decode kernel; None: paged.py's choice. Forms:
#: early (``SHAPEPLAN_PAGED_EARLY``), late (EARLY off), strided (EARLY with program s taking blocks s, s + NS, ..)
PAGED_VARIANTS = [(None, None, 64, "early"), (None, None, 64, "late")] + [
    (None, warps, splits, form) for splits, warps in ((32, None), (16, None), (16, 2), (8, None))
    for form in ("early", "strided", "late")] + [
    (mch, warps, splits, "early") for splits in (64, 32) for warps in (2, 4) for mch in (8, 16, 32, 64)]


def paged(positions: list[int], length: int, layers: int, variants: int = 0) -> None:
    """The paged decode kernel's tiling at batch 1 (see the module doc)."""
    from shapeplan.runtime.backends.triton.kernels import paged as pk
    hq, hkv, bs, dev = 32, 8, 16, "cuda"
    nb = length // bs
    print(f"{'D':>4} {'pos':>5} {'chunk,warps,splits':<19} {'us/call':>8} {'max err':>9}")
    for d in (64, 128):
        torch.manual_seed(0)
        pools = [(torch.randn(nb + 1, hkv, bs, d, device=dev, dtype=torch.bfloat16),
                  torch.randn(nb + 1, hkv, bs, d, device=dev, dtype=torch.bfloat16)) for _ in range(layers)]
        check = (torch.randn(nb + 1, hkv, bs, d, device=dev, dtype=torch.bfloat16),    # never written to
                 torch.randn(nb + 1, hkv, bs, d, device=dev, dtype=torch.bfloat16))
        bt = (torch.randperm(nb, device=dev) + 1).to(torch.int32)[None]           # scattered blocks
        q = torch.randn(1, hq, 1, d, device=dev, dtype=torch.bfloat16)
        kn = torch.randn(1, hkv, 1, d, device=dev, dtype=torch.bfloat16)
        vn = torch.randn(1, hkv, 1, d, device=dev, dtype=torch.bfloat16)
        ang = torch.arange(length, device=dev)[:, None] * 10000.0 ** (-torch.arange(d // 2, device=dev) / (d // 2))
        cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        lens = torch.ones(1, dtype=torch.int64, device=dev)
        cnt = torch.zeros(hkv, dtype=torch.int32, device=dev)
        best: dict[tuple, list[float]] = {}
        for pos in positions:
            p = torch.tensor([pos], device=dev)
            kp, vp = check                          # the reference: SDPA over the live keys, no RoPE, no write
            ks = kp[bt[0].long()].transpose(0, 1).reshape(hkv, nb * bs, d)[:, :pos + 1]
            vs = vp[bt[0].long()].transpose(0, 1).reshape(hkv, nb * bs, d)[:, :pos + 1]
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), ks.repeat_interleave(hq // hkv, 0)[None].float(),
                vs.repeat_interleave(hq // hkv, 0)[None].float(), scale=d ** -0.5)
            for mch, warps, splits, form in PAGED_VARIANTS[:variants or None]:
                lab = ("default" if (mch, warps, splits) == (None, None, 64) else f"{mch},{warps},{splits}") + \
                    ("" if form == "early" else "," + form)
                try:
                    with mock.patch.multiple(pk, MERGE_CHUNK=mch, DECODE_WARPS=warps, MAX_SPLITS=splits,
                                             EARLY=form != "late", STRIDED=form == "strided"):
                        out = pk.paged_decode_attention(q, kp, vp, p, lens, bt, scale=d ** -0.5, counters=cnt)
                        err = (out.float() - ref).abs().max().item()
                        t = timed(lambda: [pk.paged_decode_attention(q, k_, v_, p, lens, bt, scale=d ** -0.5,
                                                                     cos=cos, sin=sin, k=kn, v=vn, counters=cnt,
                                                                     rope_table=True)
                                           for k_, v_ in pools], layers)
                except Exception as e:  # noqa: BLE001 - e.g. out of resources: report the variant and go on
                    print(f"{d:>4} {pos:>5} {lab:<19} FAILED {type(e).__name__}: {str(e)[:120]}")
                    continue
                print(f"{d:>4} {pos:>5} {lab:<19} {t:>8.2f} {err:>9.1e}", flush=True)
                if err <= 2e-2:
                    best.setdefault((mch, warps, splits, form), []).append(t)
        if best:
            (mch, warps, splits, form), ts = min(best.items(), key=lambda kv: sum(kv[1]))
            name = f"merge chunk {mch}, warps {warps}, splits {splits}, {form}"
            print(f"PAGED_BEST D={d}: {name}: "
                  + ", ".join(f"{t:.2f}" for t in ts) + " us at pos " + ",".join(map(str, positions)))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.decode_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pos", default="256", help="position of the query: live cache length (default 256; --paged: a list)")
    ap.add_argument("--length", type=int, default=1024, help="static cache length (default 1024)")
    ap.add_argument("--layers", type=int, default=16, help="calls (separate caches) per CUDA graph (default 16)")
    ap.add_argument("--paged", action="store_true", help="the paged KV cache's decode kernel and its tiling instead")
    ap.add_argument("--variants", type=int, default=0,
                    help="--paged: only the first N tilings (2: the default tiling, EARLY on and off; 14: and every form at "
                         "fewer splits)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench.decode_attention: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return
    if a.paged:
        paged([int(p) for p in str(a.pos).split(",")], a.length, a.layers, a.variants)
        return
    hq, hkv, d, L, dev = 32, 8, 64, a.length, "cuda"
    torch.manual_seed(0)
    q = torch.randn(1, hq, 1, d, device=dev, dtype=torch.bfloat16)
    ks = [torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16) for _ in range(a.layers)]
    vs = [torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16) for _ in range(a.layers)]
    p = torch.tensor([int(a.pos)], device=dev)
    mask = llm_ops.causal_mask(torch.zeros(1, 1, dtype=torch.int64, device=dev), p, kv_length=L, groups=hq // hkv,
                               dtype="bfloat16")
    old = llm_ops.set_decode_attention("sdpa")
    ref = llm_ops.cached_attention(q, ks[0], vs[0], mask, scale=d ** -0.5).float()
    rows = []

    t_sdpa = timed(lambda: [llm_ops.cached_attention(q, k, v, mask, scale=d ** -0.5) for k, v in zip(ks, vs)], a.layers)
    print(f"{'variant':<22} {'us/call':>8} {'max err':>9}")
    print(f"{'sdpa (whole cache)':<22} {t_sdpa:>8.2f} {0:>9.1e}")
    llm_ops.set_decode_attention(old)
    for split, warps, dot in VARIANTS:
        da.configure(split, warps, dot)
        try:
            out = da.decode_attention(q, ks[0], vs[0], p, scale=d ** -0.5).float()
            err = (out - ref).abs().max().item()
            t = timed(lambda: [da.decode_attention(q, k, v, p, scale=d ** -0.5) for k, v in zip(ks, vs)], a.layers)
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
