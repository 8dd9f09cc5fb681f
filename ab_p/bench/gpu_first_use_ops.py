"""Which op's first use costs what in the CUDA warm-up layer (issue 7 start-up probe).

    python bench/gpu_first_use_ops.py [--full]

A fresh process makes llama-1b's random weights on the GPU (as bench/gpu_startup.py does, not timed),
then runs ``shapeplan.llm.warmup.layer`` (replay-only, or ``--full``) twice with every op kernel wrapped:
each call synchronizes and prints its wall time, so the first pass shows each kernel's first use
(library and module loading) and the second its plain cost.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shapeplan.llm import warmup  # noqa: E402
from shapeplan.llm.config import preset_config  # noqa: E402
from shapeplan.llm.weights import random_weights  # noqa: E402
from shapeplan.ops import registry  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--preset", default="llama-1b")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    cfg = preset_config(a.preset, "bfloat16")
    w = random_weights(cfg, device=dev, seed=0)
    sync()
    real = registry.lookup
    rows: list[tuple[str, float]] = []

    def lookup(op, domain="", opset=None):  # noqa: ANN001, ANN202
        d = real(op, domain, opset)
        k = d.kernel

        def timed(*args, **kw):  # noqa: ANN002, ANN003, ANN202
            sync()
            t = time.perf_counter()
            out = k(*args, **kw)
            sync()
            rows.append((op, 1000 * (time.perf_counter() - t)))
            return out
        return type("Timed", (), {"kernel": staticmethod(timed)})()
    registry.lookup = lookup
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    for rep in (1, 2):
        rows.clear()
        t = time.perf_counter()
        warmup.layer(cfg, torch.bfloat16, dev, 1024, 128, replay_only=not a.full, head=head)
        sync()
        total = 1000 * (time.perf_counter() - t)
        timed_sum = sum(ms for _, ms in rows)
        print(f"pass {rep}: total {total:.1f} ms, in op kernels {timed_sum:.1f} ms, elsewhere {total - timed_sum:.1f} ms")
        print("  " + ", ".join(f"{op} {ms:.1f}" for op, ms in rows))


if __name__ == "__main__":
    main()
