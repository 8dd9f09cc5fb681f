"""How long the pipeline's CUDA warm-up takes in a fresh process (issue 7 start-up probe).

    SHAPEPLAN_CUDA_WARM_THREADS=4 python bench/gpu_warm_threads.py [--full]

Makes llama-1b's random weights on the GPU (not timed), then times ``shapeplan.llm.warmup._run``
(replay-only unless ``--full``) with the model's head: its parts on SHAPEPLAN_CUDA_WARM_THREADS threads.
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

ap = argparse.ArgumentParser()
ap.add_argument("--full", action="store_true")
a = ap.parse_args()
cfg = preset_config("llama-1b", "bfloat16")
w = random_weights(cfg, device="cuda", seed=0)
torch.cuda.synchronize()
t = time.perf_counter()
warmup._run(cfg, torch.bfloat16, torch.device("cuda"), 1024, 128, not a.full, w["model.embed_tokens.weight"])
print(f"warm-up threads={warmup.threads()} {'full' if a.full else 'replay-only'}: "
      f"{1000 * (time.perf_counter() - t):.1f} ms")
