"""``shapeplan run MODEL --input name=file.npy [--output-dir D] [--device cpu] [--mode auto]``"""
from __future__ import annotations

import argparse
import os

import numpy as np


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a model on .npy inputs and save/print its outputs")
    p.add_argument("model", help="ONNX file (or any model sp.load accepts)")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input as a .npy file (repeat for several)")
    p.add_argument("--output-dir", "-o", default=None, help="write each output as NAME.npy here")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default="auto")
    p.add_argument("--no-optimize", action="store_true", help="skip the optimizer")
    p.set_defaults(func=_run)


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _run(args: argparse.Namespace) -> int:
    import shapeplan as sp
    from shapeplan.errors import InputError

    feeds = {}
    for item in args.input:
        if "=" not in item:
            raise InputError(f"--input {item!r}: expected NAME=FILE.npy")
        name, path = item.split("=", 1)
        if not os.path.exists(path):
            raise InputError(f"--input {name}: file {path!r} does not exist")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise InputError(f"--input {name}: {path!r} is not a plain .npy array ({e})") from e
    engine = sp.compile(args.model, device=args.device, mode=args.mode, optimize=not args.no_optimize)
    outputs = engine.run(feeds)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
    for name, value in outputs.items():
        arr = np.asarray(value)
        print(f"{name}: {arr.dtype}{list(arr.shape)}")
        if args.output_dir:
            path = os.path.join(args.output_dir, _safe_name(name) + ".npy")
            np.save(path, arr, allow_pickle=False)
            print(f"  -> {path}")
        else:
            with np.printoptions(threshold=20, edgeitems=3, precision=5):
                print(f"  {arr}")
    return 0
