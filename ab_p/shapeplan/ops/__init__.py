"""The op table. Importing this package imports every op family module in it (one registry)."""
from __future__ import annotations

import importlib
import pkgutil

from shapeplan.ops.registry import OpDef, Trait, is_supported, lookup, register, supported_ops

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name not in ("registry", "shape_fns") and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["OpDef", "Trait", "register", "lookup", "is_supported", "supported_ops"]
