"""Triton's cache keys of shapeplan's kernels remembered between processes (``triton/jit_keys.py``), checked
without a GPU: a second process sets, for every kernel of the package, the key and global values Triton's
own computation gives; a changed global or another stamp makes it compute again."""
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
        jit_keys._known = None
        jit_keys.stamp.cache_clear()
        jit_keys.stamp = lambda: "another installation"
        assert jit_keys._records() == {}                            # another stamp: nothing restored
    """)
