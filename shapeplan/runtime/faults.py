"""Fault injection for tests: ``SHAPEPLAN_FAULT=staging,allocation,capture,capture_oom`` (any of them)
makes the matching step raise ``InjectedFault``. The variable is read once, at import (``check`` runs on every replay);
tests and long processes switch faults with ``inject``, and clearing them makes the engine work again."""
from __future__ import annotations

import contextlib
from typing import Iterator

from shapeplan import env
from shapeplan.errors import InjectedFault

FAULTS = ("staging", "allocation", "capture", "capture_oom")

_active: frozenset[str] = frozenset(env.get("SHAPEPLAN_FAULT"))


def inject(*steps: str) -> frozenset[str]:
    """Make these steps fail from now on (none: no fault); returns the faults active before."""
    global _active
    unknown = sorted(set(steps) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault step(s) {unknown}; steps are {', '.join(FAULTS)}")
    old, _active = _active, frozenset(steps)
    return old


@contextlib.contextmanager
def injected(*steps: str) -> Iterator[None]:
    """The faults ``steps`` active inside the block only."""
    old = inject(*steps)
    try:
        yield
    finally:
        inject(*old)


def active(step: str) -> bool:
    return step in _active


def check(step: str) -> None:
    if _active and step in _active:
        from shapeplan import diagnostics
        diagnostics.record("ERROR", f"injected fault: {step}", step=step)
        raise InjectedFault(step, f"injected fault in step {step!r} (SHAPEPLAN_FAULT / faults.inject); "
                                  "clear it to recover")
