"""shapeplan: a compile-once, replay-many inference engine."""
from __future__ import annotations

from typing import Any

from shapeplan import _bytecode, _gc
from shapeplan import env as _env
from shapeplan._light import light_command as _light_command
from shapeplan._light import start_tokenizer_early as _start_tokenizer_early
from shapeplan.errors import (CacheError, CapacityError, CaptureError, ExecutionError, InjectedFault, InputError,
                              LifecycleError, ModelError, QueueFullError, RequestAborted, ShapeError, ShapeplanError,
                              SwitchError, UnsupportedOpError)

_bytecode.setup()                 # a command's process: bytecode where the installation ships none (before torch)
#: the engine's names, imported with the package (torch among them) but in a command that needs the standard
#: library only (``shapeplan ps`` / ``stop``, ``generate`` as a keep-alive server's client), where they import on
#: first use (``__getattr__``)
_ENGINE_NAMES = ("load", "DType", "dtype", "Graph", "Node", "Value", "ValueKind", "Engine", "Mode")


def _import_engine() -> None:
    global load, DType, dtype, Graph, Node, Value, ValueKind, Engine, Mode
    with _gc.startup():           # a command's process: no full collection over torch's objects (shapeplan/_gc.py)
        from shapeplan.importers import load
        from shapeplan.ir.dtypes import DType, dtype
        from shapeplan.ir.graph import Graph, Node, Value, ValueKind
        from shapeplan.runtime.engine import Engine
        from shapeplan.runtime.modes import Mode
        # the optimizer package: importing a submodule binds its name on this package, over the function
        # ``optimize`` below, which is put back where it was already defined
        import shapeplan.optimize  # noqa: F401
    if "_optimize_function" in globals():
        globals()["optimize"] = _optimize_function


if _gc.command_process():
    _start_tokenizer_early()      # generate / chat: tokenizer.json parsed in a helper beside torch's import
if not (_gc.command_process() and _light_command()):
    _import_engine()

__version__ = "0.1.0"

_env.check_environment()          # a SHAPEPLAN_* variable no switch reads (a typo, an old name) warns once


def optimize(model: Any, skip: list[str] | None = None, **kw: Any) -> Graph:
    """Load ``model`` and run the optimizer's pass pipeline; returns a new optimized Graph."""
    from shapeplan.optimize import optimize as _optimize
    return _optimize(load(model), skip=skip, **kw)


_optimize_function = optimize


def compile(model: Any, device: str = "cpu", mode: str | Mode = "auto", *, optimize: bool = True,
            skip: list[str] | None = None, **kw: Any) -> Engine:
    """Load, verify, optimize and compile ``model`` into an Engine (warm start from the disk plan cache
    when enabled: ``disk_cache=``, see shapeplan/runtime/compile.py)."""
    from shapeplan.runtime.compile import compile_model
    return compile_model(model, device=device, mode=mode, optimize=optimize, skip=skip, **kw)


def __getattr__(name: str) -> Any:
    if name in _ENGINE_NAMES:
        _import_engine()
        return globals()[name]
    if name in ("llm", "testing", "serve", "parallel", "diagnostics"):
        import importlib
        return importlib.import_module(f"shapeplan.{name}")
    raise AttributeError(name)


__all__ = ["CacheError", "CaptureError", "DType", "Engine", "ExecutionError", "Graph", "InjectedFault",
           "InputError", "LifecycleError", "Mode", "ModelError", "Node", "ShapeError", "ShapeplanError",
           "SwitchError", "UnsupportedOpError", "Value", "ValueKind", "compile", "dtype", "load", "optimize"]
