"""The capture-time check of a Triton step against the torch kernels it replaces, and its verdicts on disk.

At capture every Triton step runs on the call's real inputs next to its slots' torch kernels; ``close``
says whether their outputs agree within the dtype's ``TOLERANCE``. A step that passed is recorded on
disk (``verdict_key``: the kernel, its members' ops and attributes, every input/output layout, the GPU,
the versions and our Triton sources, in ``<cache>/triton_verified.txt``), and later processes skip the
check for that exact step (start-up time).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from typing import Any

import torch

from shapeplan.runtime.backends.cuda_graphs import ABSENT, Step

#: (atol, rtol) per dtype for a Triton step against the torch kernels it replaces
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-2), torch.bfloat16: (1.6e-2, 2e-2)}


def close(a: Any, b: Any) -> tuple[bool, float]:
    """(within tolerance, max abs error) for two outputs of one step."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is b or a == b, 0.0
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, float("inf")
    if not a.dtype.is_floating_point:
        return bool(torch.equal(a, b)), 0.0
    atol, rtol = TOLERANCE.get(a.dtype, (1e-6, 1e-6))
    if not a.numel():
        return True, 0.0
    af, bf = a.float(), b.float()
    err = (af - bf).abs()
    ok = torch.all(err <= atol + rtol * bf.abs()) & torch.isfinite(af).eq(torch.isfinite(bf)).all()
    flag, mx = torch.stack([ok.float(), err.nan_to_num(0.0).max()]).tolist()     # one device sync
    return flag == 1.0, mx


_build: str | None = None
_PKG = "shapeplan.runtime.backends.triton"
#: the modules whose code decides what a Triton step computes (a verdict is void when one changes)
_SOURCES = ("kernels.rows_jit", "kernels.rows", "lowerings", "codegen", "fusion", "backend", "verdicts")


def _build_id() -> str:
    """Versions and the Triton-side sources: a verdict holds for this exact build only."""
    global _build
    if _build is None:
        h = hashlib.sha256()
        try:
            from importlib.metadata import version
            h.update(version("triton").encode())
        except Exception:  # noqa: BLE001
            pass
        h.update(torch.__version__.encode())
        for mod in ("shapeplan", *(f"{_PKG}.{m}" for m in _SOURCES)):
            spec = importlib.util.find_spec(mod)
            if spec is not None and spec.origin and os.path.exists(spec.origin):
                with open(spec.origin, "rb") as f:
                    h.update(f.read())
        _build = h.hexdigest()
    return _build


def verdict_key(st: Step, regs: list[Any], device: Any) -> str:
    """What a check of ``st`` depends on: the kernel (generated source name or op + attributes), its
    members' ops, every input's layout, how many outputs it writes, the device and the build. An input
    is a tensor, or the ``Meta`` layout recorded for it (``_capture_first`` keys a step before it runs);
    the outputs' layouts follow from the inputs' (the check rejects a step whose layout differs)."""
    from shapeplan.runtime.backends.triton.codegen import Meta

    def lay(r: int) -> str:
        x = regs[r] if r != ABSENT else None
        if isinstance(x, torch.Tensor):
            return f"{tuple(x.shape)}{tuple(x.stride())}{x.dtype}"
        if isinstance(x, Meta):
            return f"{tuple(x.shape)}{tuple(x.stride)}{x.dtype}"
        return repr(x)[:64]
    dev = _device_name(device)
    parts = [st.kind, str(getattr(st.fn, "name", "")), dev, _build_id(),
             ";".join(f"{m.node.op_type}{sorted(m.node.attrs.items())!r}" for m in st.members),
             ",".join(lay(r) for r in st.ins), str(sum(1 for r in st.outs if r != ABSENT))]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


_device_names: dict[str, str] = {}


def _device_name(device: Any) -> str:
    key = str(device)
    name = _device_names.get(key)
    if name is None:
        name = torch.cuda.get_device_name(device) if getattr(device, "type", None) == "cuda" else key
        _device_names[key] = name
    return name


def _verdict_path() -> str:
    from shapeplan.runtime.backends.triton.paths import kernel_cache_paths
    return str(kernel_cache_paths()["verdicts"])


def verified() -> set[str]:
    """Keys of steps that passed the capture-time check on this machine (``<cache>/triton_verified.txt``)."""
    from shapeplan.runtime.backends.triton.paths import keys_in
    return keys_in(_verdict_path())


def remember_verdict(key: str) -> None:
    from shapeplan.runtime.backends.triton.paths import add_key
    add_key(_verdict_path(), key)


__all__ = ["TOLERANCE", "close", "remember_verdict", "verdict_key", "verified"]
