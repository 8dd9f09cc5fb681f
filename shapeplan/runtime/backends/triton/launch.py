"""Load and launch compiled Triton kernels through the CUDA driver API (ctypes), without a C build.

Triton 3.6 and earlier build two C extension modules with the system compiler before a kernel can run:
its driver's helper (``cuda_utils``: load a cubin, read device properties) once per cache, and a host
launcher per kernel signature. On a cold cache each is a compiler run of 0.1-0.4 s, and both sit on the
start-up's critical path: this process cannot hand a kernel to a compile worker before its driver is
up, and a worker's reply waited for the launcher's build after the kernel itself had compiled
(docs/benchmarks/gpu.md, fifth session: 0.03-0.23 s per kernel). What those modules do for our kernels is a
handful of driver calls, made here through ``ctypes``:

- ``Utils.load_binary``: ``cuModuleLoadData`` + ``cuModuleGetFunction``, the function's register,
  spill and thread limits, and the opt-in for more than 48 KiB of dynamic shared memory, as
  ``cuda_utils`` does; ``Utils.get_device_properties`` reads the same attributes. Anything else of
  ``cuda_utils`` (TMA descriptors, occupancy, printf) builds and uses Triton's own module on first use.
- ``Launcher``: packs the kernel's arguments by its signature (pointers from ``data_ptr()``, integers
  and floats at their declared widths, constexprs skipped, then the global and profile scratch
  pointers) and calls ``cuLaunchKernel`` on the caller's stream, which a CUDA graph capture records
  like any launch; a programmatic-dependent (``launch_pdl``) or cooperative launch goes through
  ``cuLaunchKernelEx`` with that attribute, as Triton's launcher does. Kernels it does not cover
  (tensor descriptors, clusters, scratch memory, tuple arguments) and kernels that are not shapeplan's
  get Triton's own launcher, built as before.

``install()`` (``env.patch()``, when a triton-mode engine is created) puts both in place of Triton's
classes, only on a Triton whose launcher is built per signature (``make_launcher``); later versions
launch without a build and are left alone. ``SHAPEPLAN_TRITON_CTYPES=0`` keeps Triton's own modules.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from shapeplan import env

_CU_DEVICE_ATTRIBUTE = {"max_shared_mem": 97, "max_num_regs": 12, "multiprocessor_count": 16, "warpSize": 10,
                        "sm_clock_rate": 13, "mem_clock_rate": 36, "mem_bus_width": 37}
_SHARED_PER_SM, _SHARED_OPTIN = 81, 97
_FUNC_MAX_THREADS, _FUNC_SHARED_STATIC, _FUNC_LOCAL_BYTES, _FUNC_NUM_REGS, _FUNC_MAX_DYNAMIC_SHARED = 0, 1, 3, 4, 8
_CACHE_PREFER_SHARED = 1

_INTS = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
         "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
         "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}
_FLOATS = {"fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double}

_lock = threading.Lock()
_cuda: Any = None
_local = threading.local()
_original: dict[str, Any] = {}


def enabled() -> bool:
    return env.get("SHAPEPLAN_TRITON_CTYPES")


class CudaError(RuntimeError):
    """A CUDA driver call made here failed (the message names the call and CUDA's error)."""


def _lib() -> Any:
    global _cuda
    if _cuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                       ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuFuncSetCacheConfig.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        if hasattr(lib, "cuLaunchKernelEx"):   # CUDA 12+: launches with attributes (PDL, cooperative)
            lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_void_p]
        _cuda = lib
    return _cuda


#: CUlaunchAttributeID values (cuda.h) of the two launch kinds Triton asks for
ATTR_COOPERATIVE, ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 2, 6


class LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union (its first int is
    the flag of both attributes used here)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig (the argument of cuLaunchKernelEx)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def launch_ex_available() -> bool:
    """Whether the driver has cuLaunchKernelEx (CUDA 12+; none without a driver)."""
    try:
        return hasattr(_lib(), "cuLaunchKernelEx")
    except OSError:
        return False


def launch_attributes(pdl: bool, cooperative: bool) -> ctypes.Array:
    """The attribute array of a programmatic-dependent and/or cooperative launch (each flag set to 1)."""
    ids = [i for i, on in ((ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, pdl), (ATTR_COOPERATIVE, cooperative)) if on]
    attrs = (LaunchAttribute * len(ids))()
    for a, i in zip(attrs, ids):
        a.id = i
        a.value[0] = 1
    return attrs


def _check(rc: int, call: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _lib().cuGetErrorString(rc, ctypes.byref(msg))
        text = msg.value.decode() if msg.value else f"error {rc}"
        raise CudaError(f"Triton kernel: {call} failed: {text} (CUDA error {rc})")


def _ensure_context(device: int) -> None:
    """A thread that has not used CUDA yet has no current context for the driver API: use the device's
    primary context (the one torch's runtime uses), as Triton's C helpers do."""
    if getattr(_local, "ctx", False):
        return
    lib = _lib()
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        dev = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
        _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _local.ctx = True


def _device_attr(device: int, attr: int) -> int:
    lib = _lib()
    dev, out = ctypes.c_int(), ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check(lib.cuDeviceGetAttribute(ctypes.byref(out), attr, dev.value), "cuDeviceGetAttribute")
    return out.value


def _func_attr(fn: ctypes.c_void_p, attr: int) -> int:
    out = ctypes.c_int()
    _check(_lib().cuFuncGetAttribute(ctypes.byref(out), attr, fn), "cuFuncGetAttribute")
    return out.value


class Utils:
    """Stands in for Triton's ``CudaUtils``: what loading and checking a kernel needs, through ctypes."""

    def __new__(cls) -> "Utils":              # one per process, like Triton's
        if not hasattr(cls, "instance"):
            cls.instance = super().__new__(cls)
        return cls.instance

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        lib = _lib()
        _ensure_context(device)
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib.cuModuleLoadData(ctypes.byref(mod), kernel), f"cuModuleLoadData({name})")
        _check(lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"cuModuleGetFunction({name})")
        n_regs = _func_attr(fn, _FUNC_NUM_REGS)
        n_spills = _func_attr(fn, _FUNC_LOCAL_BYTES) // 4
        n_max_threads = _func_attr(fn, _FUNC_MAX_THREADS)
        optin = _device_attr(device, _SHARED_OPTIN)
        if shared > 49152 and optin > 49152:
            _check(lib.cuFuncSetCacheConfig(fn, _CACHE_PREFER_SHARED), "cuFuncSetCacheConfig")
            static = _func_attr(fn, _FUNC_SHARED_STATIC)
            _check(lib.cuFuncSetAttribute(fn, _FUNC_MAX_DYNAMIC_SHARED, optin - static), "cuFuncSetAttribute")
        return mod.value, fn.value, n_regs, n_spills, n_max_threads

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {k: _device_attr(device, a) for k, a in _CU_DEVICE_ATTRIBUTE.items()}

    def __getattr__(self, name: str) -> Any:  # TMA descriptors, occupancy, printf: Triton's own module
        return getattr(_real_utils(), name)


def _real_utils() -> Any:
    """Triton's own helper module (a C build on a cold cache), built once on first need. Its class finds
    itself by its module's name (``super(CudaUtils, cls)``), so the name is Triton's while it is made."""
    import triton.backends.nvidia.driver as nvd
    with _lock:
        real = _original.get("utils")
        if real is None:
            ours, nvd.CudaUtils = nvd.CudaUtils, _original["CudaUtils"]
            try:
                real = _original["utils"] = _original["CudaUtils"]()
            finally:
                nvd.CudaUtils = ours
        return real


def _ours(src: Any) -> bool:
    """Kernels of shapeplan's package or of its generated-source directory."""
    fn = getattr(getattr(src, "fn", None), "fn", None)
    path = os.path.abspath(getattr(getattr(fn, "__code__", None), "co_filename", "") or "")
    if not path:
        return False
    import shapeplan
    from shapeplan.runtime.backends.triton.paths import source_dir
    roots = (os.path.dirname(os.path.abspath(shapeplan.__file__)), str(source_dir()))
    return any(path.startswith(os.path.abspath(r) + os.sep) for r in roots)


def launches(src: Any) -> bool:
    """Whether ``Launcher`` launches this kernel itself when its metadata allows (then nobody needs to
    build Triton's host launcher for it): installed, shapeplan's kernel, arguments it can pass."""
    return installed() and _ours(src) and argument_types(getattr(src, "signature", {}) or {}) is not None


def argument_types(signature: Any) -> list[str] | None:
    """The kernel's argument types in order when ``Launcher`` can pass every one of them (pointers,
    integers, fp32/fp64, constexprs); None otherwise."""
    out = []
    for ty in signature.values():
        if not isinstance(ty, str):
            return None
        if ty == "constexpr" or ty.startswith("*") or ty in _INTS or ty in _FLOATS:
            out.append(ty)
        else:
            return None
    return out


def _covered(src: Any, metadata: Any) -> list[str] | None:
    if getattr(metadata, "tensordesc_meta", None) or getattr(metadata, "num_ctas", 1) != 1:
        return None
    if (getattr(metadata, "launch_cooperative_grid", False) or getattr(metadata, "launch_pdl", False)) and \
            not launch_ex_available():
        return None
    if getattr(metadata, "global_scratch_size", 0) or getattr(metadata, "profile_scratch_size", 0):
        return None
    return argument_types(getattr(src, "signature", {}) or {})


def _pointer(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    return x.data_ptr()


def pack(types: list[str], args: tuple) -> list[Any]:
    """ctypes values of the arguments the kernel takes, in order (constexprs dropped), then the global
    and profile scratch pointers (none: null)."""
    out: list[Any] = []
    for ty, x in zip(types, args):
        if ty == "constexpr":
            continue
        if ty[0] == "*":
            out.append(ctypes.c_uint64(_pointer(x)))
        elif ty in _INTS:
            out.append(_INTS[ty](int(x)))
        else:
            out.append(_FLOATS[ty](float(x)))
    out.append(ctypes.c_uint64(0))
    out.append(ctypes.c_uint64(0))
    return out


class Launcher:
    """Stands in for Triton's per-signature ``CudaLauncher`` (same call: grid, stream, function, then the
    packed metadata (num_warps, num_ctas, shared), launch metadata, the enter/exit hooks and the
    kernel's arguments). Kernels it does not cover get Triton's own launcher."""

    def __new__(cls, src: Any, metadata: Any) -> Any:
        types = _covered(src, metadata) if _ours(src) else None
        if types is None:
            _real_utils()                      # Triton's launchers expect its helper module to be built
            return _original["CudaLauncher"](src, metadata)
        self = super().__new__(cls)
        self.types = types
        self.nargs = len(types)
        pdl, coop = bool(getattr(metadata, "launch_pdl", False)), bool(getattr(metadata, "launch_cooperative_grid", False))
        self.attrs = launch_attributes(pdl, coop) if pdl or coop else None   # then cuLaunchKernelEx
        return self

    def __init__(self, src: Any, metadata: Any) -> None:   # everything is set by __new__
        pass

    def __call__(self, gridX: int, gridY: int, gridZ: int, stream: int, function: int, kernel_metadata: Any,
                 launch_metadata: Any, enter_hook: Any, exit_hook: Any, *args: Any) -> None:
        if len(args) != self.nargs:
            raise TypeError(f"Triton kernel takes {self.nargs} arguments, {len(args)} given")
        num_warps, _num_ctas, shared = kernel_metadata
        if enter_hook is not None:
            enter_hook(launch_metadata)
        if gridX * gridY * gridZ > 0:
            if not getattr(_local, "ctx", False):
                import torch
                _ensure_context(torch.cuda.current_device())
            vals = pack(self.types, args)
            params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            if self.attrs is None:
                _check(_lib().cuLaunchKernel(function, gridX, gridY, gridZ, 32 * num_warps, 1, 1, shared, stream,
                                             params, None), "cuLaunchKernel")
            else:
                cfg = LaunchConfig(gridX, gridY, gridZ, 32 * num_warps, 1, 1, shared, stream, self.attrs,
                                   len(self.attrs))
                _check(_lib().cuLaunchKernelEx(ctypes.byref(cfg), function, params, None), "cuLaunchKernelEx")
        if exit_hook is not None:
            exit_hook(launch_metadata)


def install() -> bool:
    """Use ``Utils`` and ``Launcher`` in Triton's CUDA driver (idempotent). Returns whether they are in use:
    not when switched off or on a Triton that launches without per-signature builds."""
    if not enabled():
        return False
    try:
        import triton.backends.nvidia.driver as nvd
    except Exception:  # noqa: BLE001 - no NVIDIA backend: nothing to replace
        return False
    with _lock:
        if _original:
            return True
        if not hasattr(nvd, "make_launcher") or not hasattr(nvd, "CudaUtils") or not hasattr(nvd, "CudaLauncher"):
            return False
        _original["CudaUtils"], _original["CudaLauncher"] = nvd.CudaUtils, nvd.CudaLauncher
        nvd.CudaUtils, nvd.CudaLauncher = Utils, Launcher
        try:                                   # a driver made before this keeps its helper module but
            from triton.runtime import driver  # takes the launcher (no per-signature builds from now on)
            for made in (getattr(driver, "_default", None), getattr(driver, "_active", None)):
                if made is not None and getattr(made, "launcher_cls", None) is _original["CudaLauncher"]:
                    made.launcher_cls = Launcher
                    _original.setdefault("utils", made.utils)
        except Exception:  # noqa: BLE001, S110 - Triton's layout changed: new drivers still use ours
            pass
        return True


def installed() -> bool:
    return bool(_original)
