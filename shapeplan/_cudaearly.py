"""The CUDA driver's start, beside torch's import: in a ``generate`` or ``chat`` command on a CUDA device, a thread
initialises the driver and retains the device's primary context through ``libcuda`` itself (ctypes: the standard
library only), while ``import shapeplan`` imports torch (1.5-2.5 s on the lent GPU machines). torch's runtime then
finds that context made: the runtime API uses each device's primary context, the one ``cuDevicePrimaryCtxRetain``
makes (CUDA Runtime API, "Primary Contexts"), so its own start takes milliseconds instead of the ~0.15 s that
``cuInit`` and the context's creation took on the command's critical path (forty-third session, H100: the context
thread ran from the end of the imports, 2.33-2.48 s, and the weights' allocation waited for it).

Best effort: no ``libcuda``, a driver error or an ordinal the driver has not: the thread ends and records nothing,
and torch's own start reports the real error where there is one. The context is retained until the process ends
(as torch's is). ``CUDA_MODULE_LOADING`` is set to ``LAZY`` first where it is unset, as torch's ``_lazy_init`` sets
it, because the driver reads it at ``cuInit``. ``SHAPEPLAN_CUDA_EARLY=0``: torch starts the driver as before.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

#: ("driver", start, end) once the driver is initialised and the context retained (perf_counter clock; ``--timings``)
timeline: list[tuple[str, float, float]] = []
_started: list[threading.Thread] = []


def ordinal(device: str) -> int | None:
    """The device ordinal of ``--device``'s value: ``cuda`` 0, ``cuda:N`` N; None for any other device."""
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    return None


def start(device: str) -> threading.Thread | None:
    """Start the driver and retain ``device``'s primary context on a daemon thread (once a process); None where
    ``device`` is no CUDA device, the switch is off, this is no Linux or a thread already started."""
    from shapeplan import env
    index = ordinal(device)
    if index is None or _started or not sys.platform.startswith("linux") or not env.get("SHAPEPLAN_CUDA_EARLY"):
        return None
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")    # what torch sets before it starts the driver
    t = threading.Thread(target=_retain, args=(index,), name="shapeplan-cuda-driver", daemon=True)
    _started.append(t)
    t.start()
    return t


def _retain(index: int) -> None:
    t0 = time.perf_counter()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")                    # ctypes releases the GIL for each call
    except OSError:                                          # no driver here: torch says so if it matters
        return
    dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
        return
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
        return
    timeline.append(("driver", t0, time.perf_counter()))
