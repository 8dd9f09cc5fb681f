"""Triton kernels compiled in worker processes (``triton/workers.py``), checked without a GPU.

Triton compiles for an explicit target (sm_90) on a machine without CUDA, so the whole path runs here:
the parent wraps ``triton.compile``, a worker process compiles into the disk cache, the parent loads
the kernel from the entry the worker names, and the manifest lets the next process load it without a
worker. Neither ever computes Triton's own cache key (a hash of its whole library): the parent's
``triton_key`` cache stays empty. Each check runs in a fresh process without ``TRITON_INTERPRET`` (the interpreter, which other
test modules switch on, replaces ``@triton.jit`` functions with ones Triton cannot compile).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from shapeplan import diagnostics
    diagnostics.enable(["COMPILE", "FALLBACK"], level="detailed")
    from shapeplan.runtime.backends.triton import env, workers as triton_workers
    from shapeplan.runtime.backends.triton.kernels.rows_jit import _silu_mul_kernel
    if os.environ.get("PATCH", "1") == "1":
        env.patch()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    hits = []
    listener_ok = True
    try:
        triton.knobs.compilation.listener = lambda **kw: hits.append(kw.get("cache_hit"))
    except AttributeError:
        listener_ok = False
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": 2}).__dict__
    block = int(sys.argv[1])
    sig = {"G": "*fp16", "U": "*fp16", "Y": "*fp16", "stride_g": "i32", "stride_u": "i32", "stride_y": "i32",
           "N": "i32", "BLOCK": "constexpr"}
    src = ASTSource(_silu_mul_kernel, sig, {(7,): block}, {(0,): [["tt.divisibility", 16]]})
    t = time.perf_counter()
    k = triton.compiler.compile(src, target=target, options=options)
    from shapeplan.runtime.backends.triton.compile_worker import tritons_key
    from triton.runtime.cache import triton_key
    own = tritons_key or triton_key                  # Triton's function (replaced by the stamp key at import)
    print(json.dumps({"cubin": len(k.asm["cubin"]), "hits": hits, "listener": listener_ok,
                      "triton_key_computed": own.cache_info().currsize, "hash": k.hash,
                      "seconds": time.perf_counter() - t,
                      "events": [[e.category, e.message, e.fields.get("reason")] for e in diagnostics.events()],
                      "wrapped": triton.compiler.compile is triton_workers.compile_kernel,
                      "stamped": getattr(triton_key, "shapeplan_stamp", None) == triton_workers.stamp()}))
    """)


def _run(tmp_path, block: int, workers: str = "1", **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_DIR")}
    env.update(SHAPEPLAN_CACHE_DIR=str(tmp_path), SHAPEPLAN_TRITON_WORKERS=workers,
               TRITON_DEFAULT_FP_FUSION="1", **extra)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(block)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_worker_compiles_and_the_parent_hits_the_cache(tmp_path):
    first = _run(tmp_path, 128)
    assert first["wrapped"] and first["cubin"] > 0
    msgs = [m for _, m, _ in first["events"]]
    assert "Triton compile workers started" in msgs
    assert "Triton kernel compiled in a worker process" in msgs, first["events"]
    if first["listener"]:
        assert first["hits"] == []                 # Triton's compile never ran here: loaded what the worker wrote
    assert first["triton_key_computed"] == 0
    manifest = tmp_path / "triton" / "shapeplan_compiled.txt"
    lines = manifest.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split()[1] == first["hash"]

    again = _run(tmp_path, 128)                    # a new process: the manifest lists it, no worker at all
    assert not any("worker" in m for _, m, _ in again["events"]), again["events"]
    assert again["hash"] == first["hash"] and again["triton_key_computed"] == 0
    if again["listener"]:
        assert again["hits"] == []

    other = _run(tmp_path, 256)                    # another specialization: a worker again
    assert "Triton kernel compiled in a worker process" in [m for _, m, _ in other["events"]]
    assert len(manifest.read_text().splitlines()) == 2


def test_workers_off_compiles_in_process(tmp_path):
    res = _run(tmp_path, 64, workers="0")
    assert res["cubin"] > 0
    assert not any("worker" in m for _, m, _ in res["events"])
    if res["listener"]:
        assert res["hits"] == [False]              # Triton's own compile, with its own key
    again = _run(tmp_path, 64, workers="0")        # the manifest entry loads without Triton's key
    assert again["hash"] == res["hash"] and again["triton_key_computed"] == 0
    if again["listener"]:
        assert again["hits"] == []


def test_always_compile_is_left_to_triton(tmp_path):
    """TRITON_ALWAYS_COMPILE=1: no manifest load and no worker; Triton's own compile runs."""
    _run(tmp_path, 16)
    again = _run(tmp_path, 16, TRITON_ALWAYS_COMPILE="1")
    assert not any("worker" in m for _, m, _ in again["events"])
    if again["listener"]:
        assert again["hits"] == [False]


def test_a_manifest_entry_whose_files_are_gone_compiles_again(tmp_path):
    import shutil
    first = _run(tmp_path, 32)
    for d in (tmp_path / "triton").iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    again = _run(tmp_path, 32)
    assert again["cubin"] > 0
    assert "Triton kernel compiled in a worker process" in [m for _, m, _ in again["events"]]
    assert again["hash"] == first["hash"]          # the same stamp-keyed entry, written again


def test_the_stamp_follows_the_installation(tmp_path, monkeypatch):
    """The stamp (which stands in for Triton's key) changes when a Triton file's size or time changes."""
    from shapeplan.runtime.backends.triton import workers as tw
    root = tmp_path / "triton"
    (root / "_C").mkdir(parents=True)
    (root / "__init__.py").write_text("__version__ = '9.9.9'\n")
    lib = root / "_C" / "libtriton.so"
    lib.write_bytes(b"x" * 10)
    monkeypatch.setattr(tw, "triton_dir", lambda: str(root))
    tw.stamp.cache_clear()
    try:
        a = tw.stamp()
        tw.stamp.cache_clear()
        assert tw.stamp() == a and "9.9.9" in a
        os.utime(lib, ns=(1, 2))
        tw.stamp.cache_clear()
        b = tw.stamp()
        assert b != a
        lib.write_bytes(b"x" * 11)
        os.utime(lib, ns=(1, 2))
        tw.stamp.cache_clear()
        assert tw.stamp() != b
    finally:
        tw.stamp.cache_clear()


def test_a_job_the_worker_cannot_rebuild_is_declined_with_a_reason(tmp_path, monkeypatch):
    """A source that hashes differently in the worker is refused (the parent then compiles in-process)."""
    from shapeplan.runtime.backends.triton import workers as tw
    from shapeplan.runtime.backends.triton.kernels import rows_jit
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    enc = tw._enc
    job = {"path": rows_jit.__file__, "name": "_silu_mul_kernel",
           "signature": enc({"G": "*fp16", "U": "*fp16", "Y": "*fp16", "stride_g": "i32", "stride_u": "i32",
                             "stride_y": "i32", "N": "i32", "BLOCK": "constexpr"}),
           "constexprs": enc({(7,): 64}), "attrs": enc({}), "target": enc(("cuda", 90, 32)), "options": enc({}),
           "src_hash": "not-the-hash-the-worker-computes"}
    pool = tw._Pool(1)
    try:
        reply = pool.submit(job)
        assert reply is not None and not reply["ok"] and "hash differs" in reply["error"]
        reply = pool.submit(dict(job, name="no_such_kernel"))         # the same worker, still serving
        assert not reply["ok"] and "no_such_kernel" in reply["error"]
    finally:
        pool.close()
    assert tw._enc((1, [2, (3,)], {"a": (4,)})) == {"t": [1, [2, {"t": [3]}], {"d": [["a", {"t": [4]}]]}]}
    with pytest.raises(TypeError):
        tw._enc(object())


def test_a_dead_worker_leaves_the_pool_and_jobs_fall_back(tmp_path, monkeypatch):
    """A worker that dies answers its job with an error (the parent then compiles in-process); once
    every worker is gone, jobs get no worker at once instead of waiting."""
    from shapeplan.runtime.backends.triton import workers as tw
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    pool = tw._Pool(2)
    try:
        first = pool.submit({"path": "x", "name": "k"})      # both alive: served (and declined: no such file)
        assert first is not None and not first["ok"] and first["error"]
        for w in pool.all:
            w.proc.kill()
            w.proc.wait(timeout=30)
        replies = [pool.submit({"path": "x", "name": "k"}) for _ in range(3)]
        assert all(r is None or (not r["ok"] and r["error"]) for r in replies)   # broken pipe / "exited"
        assert pool.alive == 0 and pool.submit({"path": "x", "name": "k"}) is None
    finally:
        pool.close()


def test_a_worker_that_dies_while_starting_leaves_the_pool(tmp_path, monkeypatch):
    from shapeplan.runtime.backends.triton import workers as tw
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tw, "WORKER", str(tmp_path / "no_such_worker.py"))
    pool = tw._Pool(2)
    try:
        assert pool.submit({"path": "x", "name": "k"}) is None     # no worker ever became ready
        assert pool.alive == 0
    finally:
        pool.close()


def test_worker_count_setting(monkeypatch):
    from shapeplan.errors import SwitchError
    from shapeplan.runtime.backends.triton import workers as tw
    monkeypatch.setenv("SHAPEPLAN_TRITON_WORKERS", "3")
    assert tw.worker_count() == 3
    monkeypatch.setenv("SHAPEPLAN_TRITON_WORKERS", "0")
    assert tw.worker_count() == 0
    monkeypatch.delenv("SHAPEPLAN_TRITON_WORKERS")
    assert tw.worker_count() >= 1
    monkeypatch.setenv("SHAPEPLAN_TRITON_WORKERS", "lots")
    with pytest.raises(SwitchError, match="SHAPEPLAN_TRITON_WORKERS='lots': expected a whole number"):
        tw.worker_count()


def test_a_worker_without_triton_on_its_path_restarts_with_site(tmp_path):
    """Workers start with ``python -S`` and the parent's import path (in their settings); one that cannot
    import Triton that way (here: started without settings) restarts itself with site initialisation and
    still reports ready."""
    from shapeplan.runtime.backends.triton import workers as tw
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    p = subprocess.Popen([sys.executable, "-S", "-u", tw.WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        first = json.loads(p.stdout.readline())
        assert first["ready"] is True
    finally:
        p.stdin.close()
        p.wait(timeout=60)


@pytest.mark.parametrize("nice", ["", "0"])
def test_workers_run_below_the_parent_unless_told_not_to(tmp_path, monkeypatch, nice):
    """Workers lower their priority (default 10) so the parent, still optimizing and compiling the plan,
    keeps its cores; ``SHAPEPLAN_TRITON_WORKER_NICE=0`` keeps the parent's. ``starting`` counts workers
    that have not reported ready yet."""
    from shapeplan.runtime.backends.triton import workers as tw
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    if nice:
        monkeypatch.setenv("SHAPEPLAN_TRITON_WORKER_NICE", nice)
    else:
        monkeypatch.delenv("SHAPEPLAN_TRITON_WORKER_NICE", raising=False)
    pool = tw._Pool(1)
    monkeypatch.setattr(tw, "_pool", pool)
    try:
        reply = pool.submit({"path": "x", "name": "k"})     # waits until the worker is ready
        assert reply is not None and not reply["ok"]
        assert pool.ready == {pool.all[0].proc.pid} and pool.alive == 1 and tw.starting() == 0
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        theirs = os.getpriority(os.PRIO_PROCESS, pool.all[0].proc.pid)
        assert theirs == (min(19, mine + 10) if not nice else mine)
        pool._lost(pool.all[0])                             # a ready worker that dies leaves both counts
        assert pool.alive == 0 and not pool.ready and tw.starting() == 0
    finally:
        pool.close()


def test_compile_leaves_cores_to_starting_workers(monkeypatch):
    """While workers start, sp.compile runs torch's CPU kernels on half the cores they leave, records it,
    and restores the thread count afterwards (also when compiling fails); with no worker starting it
    changes nothing."""
    import torch

    from shapeplan import diagnostics
    from shapeplan.runtime import compile as spc
    from shapeplan.runtime.backends.triton import workers as tw
    before = torch.get_num_threads()
    seen: list[int] = []
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(tw, "starting", lambda: 6)
    diagnostics.reset()
    diagnostics.enable(["COMPILE"])
    try:
        torch.set_num_threads(8)
        with spc._cores_left_to_workers():
            seen.append(torch.get_num_threads())
        assert seen == [5] and torch.get_num_threads() == 8
        ev = [e for e in diagnostics.events() if "capped" in e.message]
        assert ev and ev[0].fields == {"threads": 5, "was": 8, "workers_starting": 6}
        with pytest.raises(RuntimeError), spc._cores_left_to_workers():
            raise RuntimeError("compile failed")
        assert torch.get_num_threads() == 8
        with spc._cores_left_to_workers():              # overlapping compiles (threads): one cap, and
            with spc._cores_left_to_workers():          # the last one out restores the count
                seen.append(torch.get_num_threads())
            seen.append(torch.get_num_threads())
        assert seen[-2:] == [5, 5] and torch.get_num_threads() == 8
        monkeypatch.setattr(tw, "starting", lambda: 0)
        with spc._cores_left_to_workers():
            seen.append(torch.get_num_threads())
        assert seen[-1] == 8
    finally:
        torch.set_num_threads(before)
        diagnostics.disable()
        diagnostics.reset()


JOB_SCRIPT = textwrap.dedent("""
    import json, sys
    from shapeplan.runtime.backends.triton import env, workers as tw
    from shapeplan.runtime.backends.triton.kernels.rows_jit import _silu_mul_kernel
    env.patch()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": 2}).__dict__
    sig = {"G": "*fp16", "U": "*fp16", "Y": "*fp16", "stride_g": "i32", "stride_u": "i32", "stride_y": "i32",
           "N": "i32", "BLOCK": "constexpr"}
    src = ASTSource(_silu_mul_kernel, sig, {(7,): 64}, {})
    job = dict(tw._job(src, target, options), launcher=sys.argv[1] == "1")
    pool = tw._Pool(1)
    try:
        print(json.dumps(pool.submit(job)))
    finally:
        pool.close()
    """)


@pytest.mark.parametrize("launcher", ["0", "1"])
def test_a_job_says_whether_the_worker_builds_a_launcher(tmp_path, launcher):
    """The parent that launches a kernel through ``launch`` asks for no host launcher: the worker
    then compiles the kernel only. The reply splits its time into the compile and the launcher's build."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_CACHE_DIR")}
    env.update(SHAPEPLAN_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", JOB_SCRIPT, launcher], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    reply = json.loads(p.stdout.strip().splitlines()[-1])
    assert reply["ok"], reply
    assert reply["compile_s"] > 0 and reply["launcher_s"] >= 0
    if launcher == "0":
        assert reply["launcher"] is False
        assert reply["launcher_s"] < 0.05         # nothing was built after the compile


def test_an_unpatched_compile_uses_the_stamp_key(tmp_path):
    """Without ``env.patch()`` (Triton's own compile, no manifest) the cache is still keyed by the
    installation stamp since ``triton.env``'s import: Triton's hash of its library is never computed, and
    a second process hits what the first compiled. ``SHAPEPLAN_TRITON_STAMP_KEY=0``: Triton's own key."""
    first = _run(tmp_path, 32, PATCH="0")
    assert not first["wrapped"] and first["stamped"] and first["triton_key_computed"] == 0
    again = _run(tmp_path, 32, PATCH="0")
    assert again["hash"] == first["hash"] and again["triton_key_computed"] == 0
    if first["listener"]:
        assert first["hits"] == [False] and again["hits"] == [True]
    own = _run(tmp_path, 32, PATCH="0", SHAPEPLAN_TRITON_STAMP_KEY="0")
    assert not own["stamped"] and own["triton_key_computed"] == 1
    if own["listener"]:
        assert own["hits"] == [False]              # another key: not the stamped entry
