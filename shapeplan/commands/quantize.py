"""``shapeplan quantize HF_DIR OUT.gguf --type Q4_K_M``: write a Hugging Face Llama, Mistral, Qwen2, Qwen3 or
Phi-3 checkpoint (or a preset's random weights, ``--preset llama-1b``) as a GGUF file llama.cpp reads
(shapeplan/quant/writer.py).

    shapeplan quantize ./Llama-3.2-1B llama-1b-Q4_K_M.gguf --type Q4_K_M
    shapeplan quantize --preset llama-8b llama-8b-Q8_0.gguf --type Q8_0 --device cuda
"""
from __future__ import annotations

import argparse
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    from shapeplan.llm.config import PRESETS
    from shapeplan.quant.recipes import FILE_TYPES
    p = sub.add_parser("quantize", help="write a checkpoint as a quantized GGUF file (Q4_K_M, Q8_0, Q4_0, ...)")
    p.add_argument("paths", nargs="+", metavar="HF_DIR OUT.gguf",
                   help="the checkpoint directory and the output file (only the output with --preset)")
    p.add_argument("--type", default="Q4_K_M", choices=list(FILE_TYPES), help="GGUF file type (default Q4_K_M)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="random weights with a public model's shapes instead")
    p.add_argument("--device", default="cpu", help="where to quantize (cuda: seconds for an 8B model)")
    p.set_defaults(func=_quantize)


def _quantize(args: argparse.Namespace) -> int:
    from shapeplan.errors import InputError
    from shapeplan.quant.writer import write_gguf, write_preset_gguf
    want = 1 if args.preset else 2
    if len(args.paths) != want:
        raise InputError("usage: shapeplan quantize HF_DIR OUT.gguf --type T, or shapeplan quantize --preset NAME "
                         "OUT.gguf --type T")
    t0 = time.perf_counter()
    if args.preset:
        s = write_preset_gguf(args.preset, args.paths[0], args.type, device=args.device)
    else:
        s = write_gguf(args.paths[0], args.paths[1], args.type, device=args.device)
    types = ", ".join(f"{n} x{c}" for n, c in sorted(s.types.items()))
    print(f"wrote {s.path}: {args.type}, {s.bytes / 1e6:.1f} MB of tensors ({types}) in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
