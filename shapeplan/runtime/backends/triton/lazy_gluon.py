"""Gluon's Hopper module imported only when something uses it.

Triton 3.6's first launch in a process builds an argument-specialization function
(``triton.runtime.jit.create_specialize_impl``) that imports ``triton.experimental.gluon.nvidia.hopper`` to
ask, of every argument, ``isinstance(arg, gluon.TensorDescriptor)``. That import pulls in Gluon's whole
language package: ~0.1 s of Python on the dev box, 0.2 s on the H200 beside a warm start's threads
(``python3 -X importtime``, docs/benchmarks/decode.md, forty-fourth session), a third of a warm start, for a
test whose answer is always "no" until Gluon itself is in use: no object can be an instance of a class
that was never defined.

``install()`` (``env.patch()``) puts a stand-in module under that name when nothing has imported it yet.
Its ``TensorDescriptor`` answers ``isinstance`` with False while the real module is not loaded and with
the real class's answer once it is; calling it, or reading any other attribute of the module, loads the
real module (which then takes its place in ``sys.modules``) and forwards to it. Code that uses Gluon
therefore gets Gluon, imported at its first use instead of at Triton's first launch.
``SHAPEPLAN_TRITON_LAZY_GLUON=0`` leaves the import to Triton.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

NAME = "triton.experimental.gluon.nvidia.hopper"
_lock = threading.RLock()
_stand_in: "types.ModuleType | None" = None


def _real() -> types.ModuleType:
    """The real module, imported now if it is not yet (the stand-in steps aside for it)."""
    with _lock:
        mod = sys.modules.get(NAME)
        if mod is not None and mod is not _stand_in:
            return mod
        sys.modules.pop(NAME, None)
        try:
            return importlib.import_module(NAME)
        except BaseException:
            if _stand_in is not None:
                sys.modules.setdefault(NAME, _stand_in)
            raise


def _loaded() -> types.ModuleType | None:
    mod = sys.modules.get(NAME)
    return None if mod is None or mod is _stand_in else mod


class _DescriptorType(type):
    """The stand-in class's type: isinstance without the import, anything else through the real class."""

    def __instancecheck__(cls, obj: Any) -> bool:
        mod = _loaded()
        return mod is not None and isinstance(obj, mod.TensorDescriptor)

    def __subclasscheck__(cls, sub: Any) -> bool:
        mod = _loaded()
        return mod is not None and issubclass(sub, mod.TensorDescriptor)

    def __call__(cls, *args: Any, **kw: Any) -> Any:
        return _real().TensorDescriptor(*args, **kw)

    def __getattr__(cls, name: str) -> Any:
        return getattr(_real().TensorDescriptor, name)


class TensorDescriptor(metaclass=_DescriptorType):
    """Stands in for ``triton.experimental.gluon.nvidia.hopper.TensorDescriptor`` (module doc)."""


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)        # import machinery probes (__path__, __file__ ...)
        return getattr(_real(), name)


def install() -> bool:
    """Put the stand-in in place unless the real module is imported already, Triton has no Gluon, or
    ``SHAPEPLAN_TRITON_LAZY_GLUON`` is off. Returns whether the stand-in is in place."""
    global _stand_in
    from shapeplan import env
    if not env.get("SHAPEPLAN_TRITON_LAZY_GLUON"):
        return False
    with _lock:
        if sys.modules.get(NAME) is not None:
            return sys.modules[NAME] is _stand_in
        spec = None
        try:
            spec = importlib.util.find_spec("triton.experimental.gluon")
        except (ImportError, ValueError):
            pass
        if spec is None:
            return False
        _stand_in = _StandIn(NAME, __doc__)
        _stand_in.TensorDescriptor = TensorDescriptor
        sys.modules[NAME] = _stand_in
        return True


def uninstall() -> None:
    """Remove the stand-in if it is still in place (tests)."""
    global _stand_in
    with _lock:
        if _stand_in is not None and sys.modules.get(NAME) is _stand_in:
            del sys.modules[NAME]
        _stand_in = None
