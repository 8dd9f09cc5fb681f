"""The ONNX light models (onnx/backend/test/data/light: ResNet-50, VGG-19, DenseNet-121, ...) on CUDA in
every execution mode, checked against slot_by_slot on the CPU (issue 5).

    python3 -m bench.onnx_light_models [--models resnet50,vgg19] [--iters 20] [--json out.json]

Run it from the repository root as shown: the models, their input and the probes come from
tests/test_light_models.py. Input: onnx's deterministic dummy input. Reference: slot_by_slot on
the CPU in float32. Tolerance (documented in docs/gpu.md): ‖out − ref‖ / ‖ref‖ <= 1e-3 and
|out − ref| <= atol + rtol·|ref| with onnx's per-model rtol and atol = 1e-4 (cuDNN picks other
convolution algorithms than the CPU; TF32 stays off unless SHAPEPLAN_TF32=1).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

import shapeplan as sp
from tests.test_light_models import MODELS as _PARAMS, load_case, with_probes

# (name, rtol); the test module wraps some in pytest.param(..., marks=slow)
MODELS = [tuple(p.values) if hasattr(p, "values") else tuple(p) for p in _PARAMS]

MODES = ["slot_by_slot", "cuda_graphs", "triton", "auto"]
REL_TOL, ATOL = 1e-3, 1e-4


def _time(fn, iters: int) -> float:
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def run_model(name: str, rtol: float, iters: int) -> list[dict]:
    try:
        model, feeds, _stored = load_case(name)
        # the light models' weights are ConstantOfShape: their logits reach 1e9..1e19, where any change
        # of summation order reorders the Softmax (see docs/benchmarks/gpu.md). So the verdict is taken on
        # five feature maps through the network; the final output's error is reported beside it.
        model = with_probes(model)
        refs = list(sp.compile(model, device="cpu", mode="slot_by_slot").run(feeds).values())
    except Exception as e:  # noqa: BLE001 - a model the CPU reference cannot run is reported, not fatal
        return [{"model": name, "mode": "cpu reference", "ok": False, "error": f"{type(e).__name__}: {e}"[:160]}]
    tfeeds = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
    rows = []
    for mode in MODES:
        row = {"model": name, "mode": mode}
        try:
            t0 = time.perf_counter()
            eng = sp.compile(model, device="cuda", mode=mode)
            for _ in range(8):                       # warm-up, freeze, per-segment warmup/compile/capture
                outs = list(eng.run(tfeeds).values())
            torch.cuda.synchronize()
            row["ready_s"] = time.perf_counter() - t0
            row["ms"] = _time(lambda: eng.run(tfeeds), iters) * 1e3
            errs = [float(np.linalg.norm(o.float().cpu().numpy() - r) / max(np.linalg.norm(r), 1e-30))
                    for o, r in zip(outs, refs)]
            row["out_rel_err"] = errs[0]
            row["rel_err"] = rel = max(errs[1:]) if len(errs) > 1 else errs[0]
            row["ok"] = bool(rel <= REL_TOL)
            info = eng.inspect()
            row["phase"] = info.phase
            segs = info.segments
            slots = sum(len(s["slots"]) for s in segs)
            cap = sum(len(s["slots"]) for s in segs if s.get("state") == "REPLAYING")
            row["coverage"] = cap / slots if slots else 0.0
            row["fused"] = sum(s.get("capture", {}).get("fused_steps", 0) for s in segs)
            row["failed"] = [s.get("failure") for s in segs if s.get("state") == "FAILED"][:2]
            del eng
        except Exception as e:  # noqa: BLE001 - one failing mode must not hide the others
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:200])
        torch.cuda.empty_cache()
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.onnx_light_models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(m for m, _ in MODELS), help="comma-separated (default: all nine)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per mode (median reported)")
    ap.add_argument("--json", default="", help="write the rows as JSON to this file")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench.onnx_light_models: CUDA is not available, nothing measured (this benchmark needs a GPU)")
        return
    want = a.models.split(",")
    rows = []
    for name, rtol in MODELS:
        if name in want:
            rows += run_model(name, rtol, a.iters)
            print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'model':<14} {'mode':<13} {'ms':>8} {'ready s':>8} {'maps err':>9} {'out err':>8} {'cover':>6} {'fused':>5}  ok")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<14} {r['mode']:<13} ERROR {r['error']}")
            continue
        print(f"{r['model']:<14} {r['mode']:<13} {r['ms']:8.2f} {r['ready_s']:8.2f} {r['rel_err']:9.1e} {r['out_rel_err']:8.1e} "
              f"{r['coverage'] * 100:5.0f}% {r['fused']:5d}  {'ok' if r['ok'] else 'MISMATCH'} {r['failed'] or ''}")
    print("all within tolerance:", all(r.get("ok") for r in rows))


if __name__ == "__main__":
    main()
