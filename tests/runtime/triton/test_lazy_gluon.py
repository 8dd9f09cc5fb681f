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
        assert lazy_gluon.install() and lazy_gluon.install()             # idempotent
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
        assert lazy_gluon.install()
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as Stand
        from triton.experimental.gluon import language as gl
        layout = gl.NVMMASharedLayout.get_default_for([16, 16], gl.float32)
        d = Stand.from_tensor(torch.zeros(16, 16), [16, 16], layout)        # loads the real module
        import triton.experimental.gluon.nvidia.hopper as hopper
        assert sys.modules[lazy_gluon.NAME] is hopper and hopper is not lazy_gluon._stand_in
        assert type(d) is hopper.TensorDescriptor and isinstance(d, Stand) and isinstance(d, hopper.TensorDescriptor)
        assert issubclass(hopper.TensorDescriptor, Stand)
        d2 = Stand(d.base, d.shape, d.strides, d.block_shape, d.layout)     # construction goes to the real class
        assert type(d2) is hopper.TensorDescriptor
        assert lazy_gluon._stand_in.TensorDescriptor is Stand and lazy_gluon._stand_in.NVMMASharedLayout is hopper.NVMMASharedLayout
    """)


def test_not_installed_when_off_or_already_imported():
    _run("""
        import sys
        from shapeplan.runtime.backends.triton import lazy_gluon
        assert not lazy_gluon.install()
        assert lazy_gluon.NAME not in sys.modules
    """, SHAPEPLAN_TRITON_LAZY_GLUON="0")
    _run("""
        import sys
        import triton.experimental.gluon.nvidia.hopper as real
        from shapeplan.runtime.backends.triton import lazy_gluon
        assert not lazy_gluon.install() and sys.modules[lazy_gluon.NAME] is real
    """)
