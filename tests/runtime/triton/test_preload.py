"""The start-up's Triton kernels recorded and preloaded by the next process (``triton/preload.py``).

Without a GPU: the records' file (stamp, order, only new records written) and the recording ``_do_compile``
on real kernels of the package (Triton's own ``serialize_specialization_data``, read back to the same
kernel). On CUDA: a recorded kernel is loaded by the next process before its first launch, so that launch
can be captured in a CUDA graph without an eager run; an unloaded one stops the capture with
``KernelNotLoaded`` before any driver call; and a pipeline's warm start with the switch captures its plans
first and gives the same tokens.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

from shapeplan.runtime.backends.triton import preload  # noqa: E402

CUDA = torch.cuda.is_available()


@pytest.fixture
def records_file(tmp_path, monkeypatch):
    target = tmp_path / "shapeplan_preload.json"
    monkeypatch.setattr(preload, "path", lambda: str(target))
    preload.reset()
    yield target
    preload.reset()


def test_records_are_written_once_under_the_stamp_and_context_and_read_back(records_file, monkeypatch):
    a = ["shapeplan.runtime.backends.triton.kernels.argmax_jit", "_arg_partial", '{"key": "a"}']
    b = ["shapeplan.runtime.backends.triton.kernels.argmax_jit", "_arg_merge", '{"key": "b"}']
    one, two = preload.context_key("llama-1b", torch.bfloat16), preload.context_key("llama-8b", torch.bfloat16)
    assert one != two and one == preload.context_key("llama-1b", torch.bfloat16)
    monkeypatch.setattr(preload, "_context", one)
    preload._new.extend([a, b])
    assert preload.save()
    data = json.loads(records_file.read_text())
    assert data["stamp"] == preload._stamp() and data["starts"] == {one: [a, b]}
    preload.reset()
    assert preload.records(one) == [a, b] and preload.records(two) == []
    monkeypatch.setattr(preload, "_context", one)
    preload._new.append(a)                          # nothing new: the file is not written again
    mtime = records_file.stat().st_mtime_ns
    assert not preload.save() and records_file.stat().st_mtime_ns == mtime
    monkeypatch.setattr(preload, "_context", two)   # another start-up's kernels: kept beside, the latest last
    preload._new.append(b)
    assert preload.save()
    preload.reset()
    assert preload.records(one) == [a, b] and preload.records(two) == [b]
    monkeypatch.setattr(preload, "MAX_CONTEXTS", 1)
    monkeypatch.setattr(preload, "_context", one)
    preload._new.append(["m", "f", "{}"])
    assert preload.save()
    preload.reset()
    assert preload.records(two) == [] and preload.records(one) == [a, b, ["m", "f", "{}"]]   # the oldest went
    monkeypatch.setattr(preload, "_stamp", lambda: "another stamp")   # edited sources or another Triton
    preload.reset()
    assert preload.records(one) == []


def test_switched_off_or_interpreting_changes_nothing(monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_TRITON_PRELOAD", "0")
    assert not preload.enabled() and not preload.install()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        monkeypatch.setenv("SHAPEPLAN_TRITON_PRELOAD", "1")
        assert not preload.enabled()                # the interpreter compiles nothing to preload


def _run(tmp_path, code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}     # real JIT functions
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env={**environ, "SHAPEPLAN_TRITON_PRELOAD": "1", "TRITON_CACHE_DIR": str(tmp_path / "tc"),
                            "SHAPEPLAN_CACHE_DIR": str(tmp_path / "sc"), **env})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_compile_of_a_package_kernel_is_recorded_as_tritons_specialization_data(tmp_path):
    """The recording wrapper around a real kernel of the package (the compile itself stubbed: no GPU here):
    the record names the kernel, holds the data Triton's ``preload`` reads, and a kernel outside the
    package is not recorded."""
    _run(tmp_path, """
        import json, types
        from shapeplan.runtime.backends.triton import preload
        from shapeplan.runtime.backends.triton.kernels import argmax_jit
        if not preload.install():
            raise SystemExit(0)                       # a Triton whose _do_compile this module does not know
        preload.start_recording("ctx")
        preload._original = lambda *a: "compiled"
        fn = argmax_jit._arg_merge
        options = types.SimpleNamespace(num_warps=1, num_stages=3)
        fn.device_caches[0] = (None, None, types.SimpleNamespace(backend="cuda", arch=90, warp_size=32), None, None)
        assert preload._do_compile(fn, "K1", {"VAL": "*fp32"}, 0, {(5,): 4}, options, {(0,): [["tt.divisibility", 16]]},
                                   False) == "compiled"
        assert preload._do_compile(fn, "K1", {"VAL": "*fp32"}, 0, {(5,): 4}, options, {(0,): [["tt.divisibility", 16]]},
                                   True) == "compiled"        # the same specialization again: one record

        from triton.language import standard
        outside = standard.sigmoid                    # a kernel of Triton's own library
        outside.device_caches[0] = fn.device_caches[0]
        preload._do_compile(outside, "K2", {"X": "*fp32"}, 0, {(1,): 4}, options, {}, False)
        assert len(preload._new) == 1, preload._new
        module, qualname, data = preload._new[0]
        assert preload._kernel_of(module, qualname) is fn
        got = json.loads(data)
        assert got["name"] == fn._fn_name and got["key"] == "K1" and got["options"]["num_warps"] == 1
        assert got["constant_keys"] == [[5]] and got["constant_vals"] == [4]
        preload.finish_recording()
        assert preload.records("ctx") == [[module, qualname, data]]
    """)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_preloaded_kernel_is_captured_without_an_eager_run(tmp_path):
    code = """
        import torch
        from shapeplan.runtime.backends.triton import preload
        from shapeplan.runtime.backends.triton.kernels import argmax
        assert preload.install()
        x = torch.randn(3, 5000, device="cuda")
    """
    _run(tmp_path, code + """
        preload.start_recording("ctx")
        assert torch.equal(argmax.argmax(x), torch.argmax(x, dim=-1))
        preload.finish_recording()
        assert len(preload.records("ctx")) == 2           # both passes
    """)
    _run(tmp_path, code + """
        assert preload.preload("ctx", 0) == 2 and preload.counts["failed"] == 0
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):                         # the first launches of this process, captured
            out = argmax.argmax(x)
        g.replay()
        assert torch.equal(out, torch.argmax(x, dim=-1))
    """)
    _run(tmp_path, code + """
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                argmax.argmax(x)
            raise AssertionError("captured a kernel that was never loaded")
        except preload.KernelNotLoaded:
            pass
        assert torch.equal(argmax.argmax(x), torch.argmax(x, dim=-1))   # the process goes on as before
        with torch.cuda.graph(g):
            out = argmax.argmax(x)
        g.replay()
        assert torch.equal(out, torch.argmax(x, dim=-1))
    """)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_pipelines_warm_start_preloads_and_captures_first(tmp_path):
    """Three processes on one cache: the cold start records, the warm start with the switch preloads the
    kernels and captures both plans before any eager run, and gives the tokens of a start without it."""
    code = """
        import torch
        from shapeplan import diagnostics
        from shapeplan.llm.config import preset_config
        from shapeplan.llm.pipeline import GenerationPipeline
        from shapeplan.llm.weights import random_weights
        cfg = preset_config("llama-tiny", "bfloat16")
        w = random_weights(cfg, device="cuda", dtype=torch.bfloat16)
        diagnostics.enable(["LIFECYCLE", "SEGMENT", "COMPILE", "FALLBACK"], level="detailed")
        pipe = GenerationPipeline(cfg, w, None, device="cuda", mode="triton", dtype=torch.bfloat16,
                                  max_prefill_length=32, max_kv_cache_length=256, eos_token_ids=[])
        toks = pipe.generate(list(range(1, 20)), max_new_tokens=16).token_ids
        msgs = [e.message for e in diagnostics.events()]
        print("TOKENS", toks)
        print("FIRST", msgs.count("captured before any eager run; replayed for this call"))
        print("EAGER", msgs.count("eager run before capture done"))
        print("PRELOADED", [e.fields.get("kernels") for e in diagnostics.events() if e.message == "Triton kernels preloaded"])
        print("FALLBACK", [e.message for e in diagnostics.events() if e.category == "FALLBACK"])
    """

    def run(**env):
        out = _run(tmp_path, code, **env)
        return {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in out.splitlines() if " " in ln}

    cold = run()
    warm = run()
    off = run(SHAPEPLAN_TRITON_PRELOAD="0")
    assert cold["TOKENS"] == warm["TOKENS"] == off["TOKENS"]
    assert warm["PRELOADED"] != "[]" and int(warm["PRELOADED"].strip("[]").split(",")[0]) > 0, warm
    assert int(warm["FIRST"]) >= 2 and int(warm["EAGER"]) == 0, warm
    assert warm["FALLBACK"] == "[]", warm
    assert int(off["EAGER"]) >= 1, off


def test_which_segments_without_fused_steps_are_captured_first(monkeypatch):
    """``TritonBackend._capture_first`` for a segment of op kernels only: with the switch, when its warm-up
    ran in this process or a preload has finished; never without it, without the layouts it was compiled
    for, or with the capture-first switch off. A segment with fused steps keeps its verdict rule."""
    from types import SimpleNamespace

    from shapeplan.runtime.backends.triton.backend import TritonBackend
    seg = SimpleNamespace(plan_key="p", plan=object(), segment=SimpleNamespace(index=0), device=torch.device("cuda"))
    slots = [SimpleNamespace(kind="slot")] * 3

    def decide(*, on=True, warmed=False, preloaded=False, metas=True, capture_first="1"):
        monkeypatch.setenv("SHAPEPLAN_CAPTURE_FIRST", capture_first)
        monkeypatch.setattr(preload, "enabled", lambda: on)
        monkeypatch.setattr(preload, "preloaded", lambda: preloaded)
        b = TritonBackend()
        key = b._key(seg)
        if metas:
            b._compiled_for[key] = {0: None}
        if warmed:
            b._warmed.add(key)
        got = b._capture_first(seg, slots, [None])
        assert key not in b._warmed and key not in b._compiled_for       # forgotten after the decision
        return got

    assert decide(warmed=True) and decide(preloaded=True)
    assert not decide() and not decide(on=False, warmed=True, preloaded=True)
    assert not decide(warmed=True, metas=False) and not decide(warmed=True, capture_first="0")
    fused = [SimpleNamespace(kind="triton")]
    b = TritonBackend()
    b._warmed.add(b._key(seg))
    assert not b._capture_first(seg, fused, [None])          # no layouts: the fused rule says no, as before
