"""Segment backends: how one captured segment is warmed up, compiled, captured and replayed.

The runner (runtime/runner.py) owns phases and per-segment states; a backend only executes. The
contract is written down in docs/runtime.md. ``register_backend(mode, factory)`` adds one; the GPU
backends (cuda_graphs, triton) register themselves the same way emulated_replay does below.
"""
from __future__ import annotations

import threading

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from shapeplan.runtime.modes import Mode


@dataclass(slots=True)
class SegmentContext:
    plan: Any                         # plan.compiler.Plan
    segment: Any                      # plan.segments.Segment
    slots: list[Any]                  # the Slot objects to run, in order
    live_in: tuple[int, ...]
    live_out: tuple[int, ...]
    device: torch.device
    plan_key: str                     # short id for diagnostics
    out_buffers: dict[int, Any] = field(default_factory=dict)   # register -> stable tensor (runner-owned)
    #: live-outs whose stable buffer shares memory with no other register: a backend may write them in
    #: place as they are produced (emulated_replay's ``out=``) instead of copying at the segment's end
    exclusive_out: frozenset[int] = frozenset()


class SegmentBackend(Protocol):
    name: str

    def available(self, device: torch.device) -> str | None: ...
    def warmup(self, seg: SegmentContext, regs: list[Any]) -> None: ...
    def compile(self, seg: SegmentContext) -> Any: ...
    def capture(self, seg: SegmentContext, compiled: Any, regs: list[Any]) -> Any: ...
    def replay(self, handle: Any, regs: list[Any]) -> None: ...
    def release(self, handle: Any) -> None: ...


_BACKENDS: dict[Mode, Callable[[], SegmentBackend]] = {}
_INSTANCES: dict[Mode, SegmentBackend] = {}


def register_backend(mode: "Mode | str", factory: Callable[[], SegmentBackend]) -> None:
    mode = Mode.parse(mode)
    _BACKENDS[mode] = factory
    _INSTANCES.pop(mode, None)


def get_backend(mode: "Mode | str") -> SegmentBackend | None:
    """The backend object for ``mode`` (None when none is registered)."""
    mode = Mode.parse(mode)
    b = _INSTANCES.get(mode)
    if b is None:
        _ensure_builtin()
        factory = _BACKENDS.get(mode)
        if factory is None:
            return None
        b = _INSTANCES[mode] = factory()
    return b


def registered_modes() -> list[Mode]:
    _ensure_builtin()
    return list(_BACKENDS)


_builtin = False
_builtin_lock = threading.RLock()


def _ensure_builtin() -> None:
    """Register the built-in backends once. Under a lock, with the flag set only when they are in: two
    engines created at once on two threads (a server loading models) both see every backend."""
    global _builtin
    if _builtin:
        return
    with _builtin_lock:
        if _builtin:
            return
        from shapeplan.runtime.backends.emulated_replay import EmulatedReplayBackend
        _BACKENDS.setdefault(Mode.EMULATED_REPLAY, EmulatedReplayBackend)
        for name in ("cuda_graphs", "triton.backend"):      # GPU backends register themselves on import
            try:
                __import__(f"shapeplan.runtime.backends.{name}")
            except ImportError:
                pass
        _builtin = True


__all__ = ["SegmentBackend", "SegmentContext", "get_backend", "register_backend", "registered_modes"]
