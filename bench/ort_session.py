"""onnxruntime against ``shapeplan.ort`` (its session API over a compiled engine) on the same ONNX models: the
time to a first answer (session made + first run, a fresh plan cache) and the steady per-call time (median
of ``--iters`` calls after a warm-up), batch by batch, with the largest difference of the outputs. The
models: ONNX's light models (``onnx/backend/test/data/light``) named with ``--models``, their first
dimension made dynamic where it is a fixed 1, and ``mlp768`` (768 -> 768 MatMul + Relu, made here).

    python3 -m bench.ort_session                                   # CPU: mlp768, squeezenet, resnet50
    python3 -m bench.ort_session --models resnet50 --device cuda   # onnxruntime's CUDA provider if it has one
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _model(name: str, tmp: str) -> str:
    from bench.serve_kserve import LIGHT, dynamic_batch, mlp768
    if name == "mlp768":
        path = os.path.join(tmp, "mlp768.onnx")
        mlp768(path)
        return path
    src = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(src):
        raise SystemExit(f"no light model {name!r} ({src})")
    path = os.path.join(tmp, f"{name}.onnx")
    dynamic_batch(src, path)
    return path


def _steady(fn: Callable[[], Any], iters: int) -> float:
    for _ in range(max(3, iters // 10)):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(path: str, batch: int, iters: int, device: str) -> dict[str, Any]:
    import onnxruntime as ort

    import shapeplan.ort as sport
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    probe = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in probe.get_inputs():
        shape = [batch if k == 0 else d for k, d in enumerate(i.shape)]
        if not all(isinstance(d, int) for d in shape):
            raise SystemExit(f"{path}: input {i.name} has a varying dimension besides the first: {i.shape}")
        feeds[i.name] = np.random.RandomState(0).rand(*shape).astype(np.float32)
    row: dict[str, Any] = {"batch": batch}
    outs = {}
    for label, make in (("onnxruntime", lambda: ort.InferenceSession(path, providers=providers)),
                        ("shapeplan.ort", lambda: sport.InferenceSession(path, providers=providers))):
        t0 = time.perf_counter()
        sess = make()
        outs[label] = sess.run(None, feeds)
        row[f"{label}_first_s"] = time.perf_counter() - t0
        row[f"{label}_ms"] = _steady(lambda: sess.run(None, feeds), iters) * 1e3
        row[f"{label}_providers"] = sess.get_providers()[0]
    row["max_abs_diff"] = max(float(np.max(np.abs(a - b))) if a.size else 0.0
                              for a, b in zip(outs["onnxruntime"], outs["shapeplan.ort"]))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp768,squeezenet,resnet50")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SHAPEPLAN_CACHE_DIR"] = os.path.join(tmp, "plans")        # a first call compiles
        for name in args.models.split(","):
            path = _model(name, tmp)
            for b in map(int, args.batches.split(",")):
                r = measure(path, b, args.iters, args.device)
                r["model"] = name
                results.append(r)
                print(f"  {name} batch {b}: done", file=sys.stderr, flush=True)
    used = sorted({f"onnxruntime {r['onnxruntime_providers']}, shapeplan.ort {r['shapeplan.ort_providers']}"
                   for r in results})
    print(f"\nonnxruntime vs shapeplan.ort, device {args.device}, median of {args.iters} calls ({'; '.join(used)})")
    print(f"{'model':<12}{'batch':>6}{'ORT ms':>10}{'ours ms':>10}{'ORT/ours':>10}{'ORT first s':>13}"
          f"{'ours first s':>14}{'max |diff|':>12}")
    for r in results:
        print(f"{r['model']:<12}{r['batch']:>6}{r['onnxruntime_ms']:>10.3f}{r['shapeplan.ort_ms']:>10.3f}"
              f"{r['onnxruntime_ms'] / r['shapeplan.ort_ms']:>10.2f}{r['onnxruntime_first_s']:>13.3f}"
              f"{r['shapeplan.ort_first_s']:>14.3f}{r['max_abs_diff']:>12.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
