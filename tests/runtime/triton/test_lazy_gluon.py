"""Gluon imported at its first use (``triton/lazy_gluon.py``), checked without a GPU in fresh interpreters:
the stand-in answers ``isinstance`` without importing Gluon, and Gluon used through it (a real tensor
descriptor built, its module's other names read) works as the real module does."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
try:
    import importlib.util
    _HAS_GLUON = importlib.util.find_spec("triton.experimental.gluon") is not None
except (ImportError, ValueError):
    _HAS_GLUON = False
pytestmark = pytest.mark.skipif(not _HAS_GLUON, reason="this Triton has no Gluon")


def _run(code: str, **env: str) -> None:
    import os
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stdout + r.stderr


def test_isinstance_answers_without_the_import():
    _run("""
        import sys, torch
        from shapeplan.runtime.backends.triton import lazy_gluon
        hopper = "triton.experimental.gluon.nvidia.hopper"
        assert hopper in lazy_gluon.install() and lazy_gluon.install() == lazy_gluon.install()   # idempotent
        # what Triton 3.6's first launch does
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        for arg in (None, 3, 0.5, torch.zeros(2), (1, 2), object()):
            assert not isinstance(arg, TensorDescriptor)
        assert not issubclass(int, TensorDescriptor)
        assert not any(m.startswith("triton.experimental.gluon.language") for m in sys.modules), sorted(sys.modules)
    """)


def test_gluon_used_through_the_stand_in_is_gluon():
    _run("""
        import sys, torch
        from shapeplan.runtime.backends.triton import lazy_gluon
        name = "triton.experimental.gluon.nvidia.hopper"
        assert name in lazy_gluon.install()
        stand_in = lazy_gluon._stand_ins[name]
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as Stand
        from triton.experimental.gluon import language as gl
        layout = gl.NVMMASharedLayout.get_default_for([16, 16], gl.float32)
        d = Stand.from_tensor(torch.zeros(16, 16), [16, 16], layout)        # loads the real module
        import triton.experimental.gluon.nvidia.hopper as hopper
        assert sys.modules[name] is hopper and hopper is not stand_in
        assert type(d) is hopper.TensorDescriptor and isinstance(d, Stand) and isinstance(d, hopper.TensorDescriptor)
        assert issubclass(hopper.TensorDescriptor, Stand)
        d2 = Stand(d.base, d.shape, d.strides, d.block_shape, d.layout)     # construction goes to the real class
        assert type(d2) is hopper.TensorDescriptor
        assert stand_in.TensorDescriptor is Stand and stand_in.NVMMASharedLayout is hopper.NVMMASharedLayout
    """)


def test_only_plain_modules_get_a_stand_in():
    _run("""
        import importlib.util, os
        from shapeplan.runtime.backends.triton import lazy_gluon
        got = lazy_gluon.install()
        root = importlib.util.find_spec("triton.experimental").submodule_search_locations[0]
        for name, rel in lazy_gluon.NAMES.items():      # a package of that name (Triton 3.9's gfx1250): left alone
            assert (name in got) == os.path.isfile(os.path.join(root, rel)), (name, got)
    """)


def test_not_installed_when_off_or_already_imported():
    _run("""
        import sys
        from shapeplan.runtime.backends.triton import lazy_gluon
        assert lazy_gluon.install() == []
        assert not any(n in sys.modules for n in lazy_gluon.NAMES)
    """, SHAPEPLAN_TRITON_LAZY_GLUON="0")
    _run("""
        import sys
        import triton.experimental.gluon.nvidia.hopper as real
        from shapeplan.runtime.backends.triton import lazy_gluon
        assert real.__name__ not in lazy_gluon.install() and sys.modules[real.__name__] is real
    """)
