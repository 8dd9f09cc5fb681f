"""Fault injection for tests: ``SHAPEPLAN_FAULT=staging|allocation|capture`` (comma-separated) makes the
matching step raise. The variable is read at each step, so clearing it makes the engine work again."""
from __future__ import annotations

import os

from shapeplan.errors import CaptureError, ExecutionError

FAULTS = ("staging", "allocation", "capture")


def check(step: str) -> None:
    spec = os.environ.get("SHAPEPLAN_FAULT")
    if spec and step in spec.split(","):
        from shapeplan import diagnostics
        diagnostics.record("ERROR", f"injected fault: {step}", step=step)
        cls = CaptureError if step == "capture" else ExecutionError
        raise cls(f"injected fault in step {step!r} (SHAPEPLAN_FAULT={spec}); clear the variable to recover")
