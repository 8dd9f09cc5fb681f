"""How fast can compile workers be ready? Spawned processes vs forks of one process that imported Triton.

    python bench/gpu_probe_workers.py [--n 8]

A cold start of the triton mode waits for a worker to import Triton before the first kernel compiles.
This probe times, from the moment the parent starts them: (a) one spawned ``python -S`` worker importing
Triton, (b) N spawned at once (each loads the ~500 MB libtriton.so and relocates it), (c) one ``python -S``
*zygote* that imports Triton once and forks N children. Each worker or child then compiles a distinct
kernel (sm_90, fresh Triton cache) so the compile time under each arrangement is measured too.
Prints a table; no GPU is needed for the compile itself.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KFILE = os.path.join(HERE, "shapeplan", "runtime", "backends", "triton", "kernels", "rows_jit.py")

CHILD = textwrap.dedent("""
    import json, os, sys, time
    sys.path[:] = sys.path + [p for p in os.environ["PROBE_PATH"].split(os.pathsep) if p]
    t_spawn = float(os.environ["PROBE_T0"])
    import triton
    t_import = time.time() - t_spawn
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    import importlib.util

    def compile_one(block, cache):
        os.environ["TRITON_CACHE_DIR"] = cache
        spec = importlib.util.spec_from_file_location("probe_k", os.environ["PROBE_KFILE"])
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        target = GPUTarget("cuda", 90, 32)
        options = make_backend(target).parse_options({"num_warps": 4})
        sig = {"G": "*fp16", "U": "*fp16", "Y": "*fp16", "stride_g": "i32", "stride_u": "i32",
               "stride_y": "i32", "N": "i32", "BLOCK": "constexpr"}
        src = ASTSource(mod._silu_mul_kernel, sig, {(7,): block}, {(0,): [["tt.divisibility", 16]]})
        t = time.perf_counter()
        triton.compile(src, target=target, options=options.__dict__)
        return time.perf_counter() - t

    mode, blocks, cache = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], sys.argv[3]
    if mode == "spawn":
        c = compile_one(blocks[0], cache)
        print(json.dumps({"ready": t_import, "compile": c, "done": time.time() - t_spawn}), flush=True)
    else:                                   # zygote: fork one child per block
        pids = []
        for b in blocks:
            pid = os.fork()
            if pid == 0:
                ready = time.time() - t_spawn
                c = compile_one(b, cache)
                print(json.dumps({"ready": ready, "compile": c, "done": time.time() - t_spawn,
                                  "zygote_import": t_import}), flush=True)
                os._exit(0)
            pids.append(pid)
        for p in pids:
            os.waitpid(p, 0)
""")


def run(mode: str, n: int, base_block: int) -> list[dict]:
    cache = tempfile.mkdtemp(prefix="probe_tc_")
    env = dict(os.environ, PROBE_PATH=os.pathsep.join(p for p in sys.path if p), PROBE_KFILE=KFILE)
    env.pop("TRITON_CACHE_DIR", None)
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    blocks = [base_block * (2 ** i) for i in range(n)]          # one distinct kernel each
    t0 = time.time()
    env["PROBE_T0"] = repr(t0)
    if mode == "spawn":
        procs = [subprocess.Popen([sys.executable, "-S", "-c", CHILD, "spawn", str(b), cache], env=env,
                                  stdout=subprocess.PIPE, text=True) for b in blocks]
        outs = [p.communicate(timeout=300)[0] for p in procs]
    else:
        p = subprocess.Popen([sys.executable, "-S", "-c", CHILD, "zygote", ",".join(map(str, blocks)), cache],
                             env=env, stdout=subprocess.PIPE, text=True)
        outs = [p.communicate(timeout=300)[0]]
    rows = [json.loads(line) for o in outs for line in o.splitlines() if line.startswith("{")]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    print(f"{'arrangement':<24} {'ready s (min/med/max)':>24} {'compile s (med)':>16} {'all done s':>11}")
    for rep in range(a.repeat):
        for mode, n in (("spawn", 1), ("spawn", a.n), ("zygote", a.n)):
            rows = run(mode, n, 64)                     # a fresh Triton cache each run
            r = [x["ready"] for x in rows]
            c = [x["compile"] for x in rows]
            d = max(x["done"] for x in rows)
            extra = f"  (zygote import {rows[0]['zygote_import']:.3f} s)" if mode == "zygote" else ""
            print(f"{mode + ' x' + str(n):<24} {min(r):8.3f} {statistics.median(r):7.3f} {max(r):7.3f} "
                  f"{statistics.median(c):16.3f} {d:11.3f}{extra}", flush=True)


if __name__ == "__main__":
    main()
