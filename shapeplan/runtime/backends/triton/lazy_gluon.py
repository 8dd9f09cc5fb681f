"""Gluon's tensor-descriptor modules imported only when something uses them.

Triton 3.6's first launch in a process builds an argument-specialization function
(``triton.runtime.jit.create_specialize_impl``) that imports Gluon's tensor-descriptor classes
(``triton.experimental.gluon.nvidia.hopper``, ``triton.experimental.gluon.amd.gfx1250``) to ask, of every
argument, ``isinstance(arg, TensorDescriptor)``. Those imports pull in Gluon's whole language package:
~0.1 s of Python on the dev box, 0.2 s on the H200 beside a warm start's threads (``python3 -X importtime``,
docs/benchmarks/decode.md, forty-fourth session), a quarter of a warm start, for a test whose answer is
always "no" until Gluon itself is in use: no object can be an instance of a class never defined.

``install()`` (``env.patch()``) puts a stand-in module under each of those names that nothing has imported
yet and that is a plain module in this Triton. Its ``TensorDescriptor`` answers ``isinstance`` with False
while the real module is not loaded and with the real class's answer once it is; calling it, or reading any
other attribute of the module, loads the real module (which then takes its place in ``sys.modules``) and
forwards to it. Code that uses Gluon therefore gets Gluon, imported at its first use instead of at
Triton's first launch.
``SHAPEPLAN_TRITON_LAZY_GLUON=0`` leaves the import to Triton.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import types
from typing import Any

#: the modules Triton 3.6's specialization imports for their TensorDescriptor (path under triton/experimental)
NAMES = {"triton.experimental.gluon.nvidia.hopper": "gluon/nvidia/hopper.py",
         "triton.experimental.gluon.amd.gfx1250": "gluon/amd/gfx1250.py"}
_lock = threading.RLock()
_stand_ins: dict[str, types.ModuleType] = {}


def _real(name: str) -> types.ModuleType:
    """The real module, imported now if it is not yet (its stand-in steps aside for it)."""
    with _lock:
        mod = sys.modules.get(name)
        if mod is not None and mod is not _stand_ins.get(name):
            return mod
        sys.modules.pop(name, None)
        try:
            return importlib.import_module(name)
        except BaseException:
            if name in _stand_ins:
                sys.modules.setdefault(name, _stand_ins[name])
            raise


def _loaded(name: str) -> types.ModuleType | None:
    mod = sys.modules.get(name)
    return None if mod is None or mod is _stand_ins.get(name) else mod


class _DescriptorType(type):
    """The stand-in classes' type: isinstance without the import, anything else through the real class."""
    _module: str

    def __instancecheck__(cls, obj: Any) -> bool:
        mod = _loaded(cls._module)
        return mod is not None and isinstance(obj, mod.TensorDescriptor)

    def __subclasscheck__(cls, sub: Any) -> bool:
        mod = _loaded(cls._module)
        return mod is not None and issubclass(sub, mod.TensorDescriptor)

    def __call__(cls, *args: Any, **kw: Any) -> Any:
        return _real(cls._module).TensorDescriptor(*args, **kw)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(_real(cls._module).TensorDescriptor, name)


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)        # import machinery probes (__path__, __file__ ...): a plain module
        return getattr(_real(self.__name__), name)


def install() -> list[str]:
    """Put a stand-in under each name of ``NAMES`` that is a plain module of this Triton and not imported
    yet, unless ``SHAPEPLAN_TRITON_LAZY_GLUON`` is off. Returns the names that have one now."""
    from shapeplan import env
    if not env.get("SHAPEPLAN_TRITON_LAZY_GLUON"):
        return []
    try:
        spec = importlib.util.find_spec("triton.experimental")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    with _lock:
        for name, rel in NAMES.items():
            if name in sys.modules or not roots or not os.path.isfile(os.path.join(roots[0], rel)):
                continue
            mod = _StandIn(name, __doc__)
            mod.TensorDescriptor = _DescriptorType("TensorDescriptor", (), {
                "_module": name, "__doc__": f"Stands in for {name}.TensorDescriptor (shapeplan lazy_gluon)"})
            _stand_ins[name] = sys.modules[name] = mod
        return [n for n, m in _stand_ins.items() if sys.modules.get(n) is m]


def uninstall() -> None:
    """Remove the stand-ins still in place (tests)."""
    with _lock:
        for name, mod in _stand_ins.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]
        _stand_ins.clear()
