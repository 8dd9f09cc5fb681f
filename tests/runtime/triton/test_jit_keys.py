"""Triton's cache keys of shapeplan's kernels remembered between processes (``triton/jit_keys.py``), checked
without a GPU: a second process sets, for every kernel of the package, the key and global values Triton's
own computation gives; a changed global or another stamp makes it compute again. The same for the kernels'
source lines, which ``@triton.jit`` reads at import."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

PRELUDE = """
    import importlib, pkgutil, sys
    from triton.runtime.jit import JITCallable
    from shapeplan.runtime.backends.triton import jit_keys
    assert jit_keys.install()
    import shapeplan.runtime.backends.triton.kernels as k
    mods = [importlib.import_module(f"{k.__name__}.{m.name}") for m in pkgutil.iter_modules(k.__path__)]
    fns = list({id(v): v for m in mods for v in vars(m).values() if isinstance(v, JITCallable)}.values())
    assert len(fns) > 20
"""


def _run(tmp_path, code: str, **env: str) -> str:
    full = textwrap.dedent(PRELUDE) + textwrap.dedent(code)
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}     # real JIT functions
    r = subprocess.run([sys.executable, "-c", full], capture_output=True, text=True, timeout=300,
                       env={**environ, "SHAPEPLAN_TRITON_JIT_KEYS": "1", "TRITON_CACHE_DIR": str(tmp_path / "tc"),
                            "SHAPEPLAN_CACHE_DIR": str(tmp_path / "sc"), **env})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_the_next_process_gets_tritons_own_keys(tmp_path):
    _run(tmp_path, """
        keys = [f.cache_key for f in fns]
        assert jit_keys.counts["restored"] == 0 and jit_keys.counts["computed"] >= len(fns) - 2
        jit_keys.save()
    """)
    out = _run(tmp_path, """
        got = {id(f): (f.cache_key, dict(f.used_global_vals)) for f in fns}
        print("restored", jit_keys.counts["restored"], "of", len(fns))
        assert jit_keys.counts["restored"] >= len(fns) - 2, jit_keys.counts
        jit_keys.uninstall()                                   # Triton's own computation, from scratch
        for f in fns:
            f.hash, f.used_global_vals = None, {}
        for f in fns:
            key, used = got[id(f)]
            assert f.cache_key == key, f.__name__
            assert {n: v for (n, _), (v, _) in f.used_global_vals.items()} == {n: v for (n, _), (v, _) in used.items()}
    """)
    assert "restored" in out


def test_a_changed_global_or_stamp_computes_again(tmp_path):
    _run(tmp_path, """
        for f in fns:
            f.cache_key
        jit_keys.save()
    """)
    _run(tmp_path, """
        with_globals = [f for f in fns if jit_keys._records().get(jit_keys._ident(f), {}).get("globals")]
        assert with_globals
        f = with_globals[0]
        mod, name, _ = jit_keys._records()[jit_keys._ident(f)]["globals"][0]
        sys.modules[mod].__dict__[name] = 12345                  # a global's value that differs from the record's
        assert not jit_keys._restore(f, jit_keys._ident(f)) and f.hash is None
        jit_keys._file = None
        jit_keys.stamp.cache_clear()
        jit_keys.stamp = lambda: "another installation"
        assert jit_keys._records() == {}                            # another stamp: nothing restored
    """)


def test_the_next_process_decorates_from_the_remembered_source_lines(tmp_path):
    def run(code: str) -> str:
        return _run(tmp_path, code).strip()

    # the prelude installs before it imports the kernel modules: the first process reads every source
    first = run("""
        print(jit_keys.counts["sources_read"], jit_keys.counts["sources_restored"])
        jit_keys.save()
    """)
    read, restored = map(int, first.split()[-2:])
    assert read > 20 and restored == 0
    second = run("""
        import inspect
        import triton.runtime.jit as J
        assert isinstance(J.inspect, jit_keys.SourceLines)
        print(len(fns), jit_keys.counts["sources_read"], jit_keys.counts["sources_restored"])
        for f in fns:                      # what @triton.jit got equals the file's own lines, and its key Triton's
            assert (f.raw_src, f.starting_line_number) == inspect.getsourcelines(f.fn), f.__name__
        keys = {id(f): f.cache_key for f in fns}
        jit_keys.uninstall()
        assert J.inspect is inspect
        for f in fns:
            f.hash, f.used_global_vals = None, {}
            assert f.cache_key == keys[id(f)], f.__name__
    """)
    n, read, restored = map(int, second.split()[-3:])
    assert restored >= n and read == 0, second


def test_sources_of_other_functions_and_another_stamp_are_read(tmp_path):
    (tmp_path / "outside_mod.py").write_text("import triton\n\n\n@triton.jit\ndef outside(x):\n    pass\n")
    _run(tmp_path, f"""
        sys.path.insert(0, {str(tmp_path)!r})
        before = jit_keys.counts["sources_read"]
        import outside_mod                                  # a kernel outside the package: read, not recorded
        assert jit_keys.counts["sources_read"] == before and jit_keys._source_ident(outside_mod.outside.fn) is None
        assert outside_mod.outside.raw_src[-1].strip() == "pass" and outside_mod.outside.starting_line_number == 4
        jit_keys.save()
        jit_keys._file = None
        assert len(jit_keys._sources()) >= len(fns)         # the package's kernels, recorded
        jit_keys._file = None
        jit_keys.stamp = lambda: "another installation"
        assert jit_keys._sources() == {{}}                  # another stamp: every source read again
    """)
