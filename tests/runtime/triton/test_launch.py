"""Loading and launching Triton kernels through the CUDA driver API (``triton/launch.py``), checked without a GPU.

What runs here: which kernels it covers, how arguments are packed (the order and widths Triton's own
per-signature launcher uses: constexprs dropped, then the global and profile scratch pointers), and
how it takes Triton's place. The launches themselves run in every GPU test of the triton backend
(tests/gpu, tests/llm/test_gpu.py), which go through it on a Triton that builds launchers per signature.
"""
from __future__ import annotations

import ctypes
import types

import pytest

pytest.importorskip("triton")

from shapeplan.runtime.backends.triton import launch as tl  # noqa: E402


def test_covered_argument_types():
    sig = {"X": "*fp16", "Y": "*kbf16", "n": "i32", "m": "i64", "u": "u64", "eps": "fp32", "B": "constexpr",
           "flag": "i1"}
    assert tl.argument_types(sig) == list(sig.values())
    for bad in ("fp16", "bf16", "nvTmaDesc", "tensordesc<fp16[16, 16]>"):
        assert tl.argument_types({"X": "*fp32", "a": bad}) is None
    assert tl.argument_types({"X": ("*fp32", "*fp32")}) is None        # tuple arguments: Triton's launcher


def test_pack_orders_and_sizes_the_arguments_like_tritons_launcher():
    class T:
        def data_ptr(self):
            return 0x7F0000001000

    vals = tl.pack(["*fp16", "i32", "constexpr", "i64", "fp32", "*fp32", "u8"], (T(), -3, 128, 2 ** 40, 0.5, None, 7))
    assert [type(v) for v in vals] == [ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float,
                                       ctypes.c_uint64, ctypes.c_uint8, ctypes.c_uint64, ctypes.c_uint64]
    assert [v.value for v in vals] == [0x7F0000001000, -3, 2 ** 40, 0.5, 0, 7, 0, 0]    # scratch pointers: null


def test_what_the_launcher_leaves_to_triton(monkeypatch):
    meta = types.SimpleNamespace(num_ctas=1, global_scratch_size=0, profile_scratch_size=0,
                                 launch_cooperative_grid=False, launch_pdl=False, tensordesc_meta=None)
    src = types.SimpleNamespace(signature={"X": "*fp32", "n": "i32"})
    assert tl._covered(src, meta) == ["*fp32", "i32"]
    for field, value in (("num_ctas", 2), ("global_scratch_size", 64), ("profile_scratch_size", 8),
                         ("tensordesc_meta", [{}])):
        assert tl._covered(src, types.SimpleNamespace(**{**vars(meta), field: value})) is None, field
    for ex in (True, False):                       # PDL and cooperative launches: here where cuLaunchKernelEx is
        monkeypatch.setattr(tl, "launch_ex_available", lambda ex=ex: ex)
        for field in ("launch_cooperative_grid", "launch_pdl"):
            got = tl._covered(src, types.SimpleNamespace(**{**vars(meta), field: True}))
            assert got == (["*fp32", "i32"] if ex else None), (field, ex)


def test_launch_config_structs_have_cudas_layout():
    """CUlaunchAttribute and CUlaunchConfig as cuda.h (CUDA 12/13) lays them out on x86-64, and the PDL
    attribute as Triton's launcher sets it (id 6, value 1)."""
    assert ctypes.sizeof(tl.LaunchAttribute) == 72 and tl.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(tl.LaunchConfig) == 56
    assert [getattr(tl.LaunchConfig, f).offset for f in ("sharedMemBytes", "hStream", "attrs", "numAttrs")] == \
        [24, 32, 40, 48]
    attrs = tl.launch_attributes(pdl=True, cooperative=False)
    assert len(attrs) == 1 and attrs[0].id == 6 and attrs[0].value[0] == 1
    both = tl.launch_attributes(pdl=True, cooperative=True)
    assert [a.id for a in both] == [6, 2] and all(a.value[0] == 1 for a in both)


def test_only_shapeplans_kernels_are_launched_here(tmp_path, monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    from shapeplan.runtime.backends.triton.kernels import rows_jit

    def src_of(fn):
        return types.SimpleNamespace(fn=types.SimpleNamespace(fn=fn))
    kernel = getattr(rows_jit._silu_mul_kernel, "fn", rows_jit._silu_mul_kernel)
    assert tl._ours(src_of(kernel))

    def elsewhere():
        pass
    assert not tl._ours(src_of(elsewhere))
    generated = tmp_path / "triton_src" / "k.py"
    generated.parent.mkdir(parents=True, exist_ok=True)
    generated.write_text("def k():\n    pass\n")
    ns: dict = {}
    exec(compile(generated.read_text(), str(generated), "exec"), ns)
    assert tl._ours(src_of(ns["k"]))


def test_install_replaces_tritons_classes_only_where_it_builds_launchers(monkeypatch):
    import triton.backends.nvidia.driver as nvd
    monkeypatch.setattr(tl, "_original", {})
    utils, launcher = nvd.CudaUtils, nvd.CudaLauncher
    if not hasattr(nvd, "make_launcher"):          # a Triton that launches without builds: left alone
        assert tl.install() is False and nvd.CudaUtils is utils
        monkeypatch.setattr(nvd, "make_launcher", lambda *a: None, raising=False)
    monkeypatch.setenv("SHAPEPLAN_TRITON_CTYPES", "0")
    assert tl.install() is False and nvd.CudaLauncher is launcher
    monkeypatch.delenv("SHAPEPLAN_TRITON_CTYPES")
    try:
        assert tl.install() is True and tl.installed()
        assert nvd.CudaUtils is tl.Utils and nvd.CudaLauncher is tl.Launcher
        assert tl.install() is True                # idempotent
    finally:
        nvd.CudaUtils, nvd.CudaLauncher = utils, launcher


def test_a_kernel_that_is_not_ours_gets_tritons_launcher(monkeypatch):
    made = []
    monkeypatch.setattr(tl, "_original", {"CudaUtils": lambda: "real utils",
                                          "CudaLauncher": lambda src, meta: made.append(src) or "triton's"})
    src = types.SimpleNamespace(fn=types.SimpleNamespace(fn=lambda: None), signature={"X": "*fp32"})
    assert tl.Launcher(src, types.SimpleNamespace()) == "triton's" and made == [src]
    assert tl._original["utils"] == "real utils"   # its helper module was built first


def test_tritons_helper_module_is_built_under_its_own_name(monkeypatch):
    """Triton's CudaUtils.__new__ finds its class by the module's name (``super(CudaUtils, cls)``): with
    ours installed under that name, building Triton's own helper (for a kernel it launches) must put
    Triton's class back while it is made (it raised TypeError on the H200 for every PDL launch)."""
    import triton.backends.nvidia.driver as nvd

    class Real:
        def __new__(cls):
            assert nvd.CudaUtils is Real
            return super().__new__(cls)
    monkeypatch.setattr(tl, "_original", {"CudaUtils": Real})
    monkeypatch.setattr(nvd, "CudaUtils", tl.Utils)
    assert isinstance(tl._real_utils(), Real) and nvd.CudaUtils is tl.Utils
