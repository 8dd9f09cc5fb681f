"""Where applied rewrites (and declined fusions) are reported: the ``shapeplan.optimize`` logger
(``SHAPEPLAN_OPTIMIZER_LOG=1``) and, when ``shapeplan.diagnostics.record`` exists, FUSION events."""
from __future__ import annotations

import logging
from typing import Any, Callable

from shapeplan import env

log = logging.getLogger("shapeplan.optimize")


def _diag_record() -> Callable[..., Any] | None:
    try:
        from shapeplan import diagnostics  # noqa: PLC0415  (built by another module; optional)
    except Exception:  # noqa: BLE001
        return None
    rec = getattr(diagnostics, "record", None)
    return rec if callable(rec) else None


def _fusion_category() -> Any:
    try:
        from shapeplan import diagnostics  # noqa: PLC0415
        cat = getattr(diagnostics, "Category", None)
        return getattr(cat, "FUSION") if cat is not None else "FUSION"
    except Exception:  # noqa: BLE001
        return "FUSION"


class EventSink:
    """Where applied rewrites (and declined fusions) are reported: logging + diagnostics FUSION."""

    def __init__(self) -> None:
        self.log_enabled = env.get("SHAPEPLAN_OPTIMIZER_LOG")
        self.record = _diag_record()
        self.category = _fusion_category() if self.record is not None else None
        if self.log_enabled and not log.handlers and not logging.getLogger().handlers:
            h = logging.StreamHandler()            # stderr
            h.setFormatter(logging.Formatter("[shapeplan.optimize] %(message)s"))
            log.addHandler(h)
            log.setLevel(logging.INFO)

    def emit(self, pass_name: str, message: str, declined: bool = False, **fields: Any) -> None:
        if self.log_enabled:
            log.warning("%s: %s%s", pass_name, "declined: " if declined else "", message)
        if self.record is not None:
            try:
                self.record(self.category, f"{pass_name}: {message}", pass_name=pass_name,
                            declined=declined, **fields)
            except Exception:  # noqa: BLE001 - diagnostics must never break optimization
                self.record = None


_SINK: EventSink | None = None


def sink() -> EventSink:
    global _SINK
    if _SINK is None:
        _SINK = EventSink()
    return _SINK


def reset() -> None:
    """Re-read the environment and re-probe diagnostics."""
    global _SINK
    _SINK = EventSink()
