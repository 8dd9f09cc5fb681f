"""Diagnostics: every decision the engine makes, as events in a bounded ring buffer.

    from shapeplan import diagnostics
    diagnostics.record("SEGMENT", "segment captured", plan="p3", segment=0)   # ~free when disabled
    diagnostics.enable("ALL", level="detailed")         # or SHAPEPLAN_DIAGNOSTICS=SEGMENT,CACHE
    diagnostics.report()                                # JSON-able dict (counters, events, segments)

Environment: ``SHAPEPLAN_DIAGNOSTICS=CAT,CAT|ALL``, ``SHAPEPLAN_DIAGNOSTICS_LEVEL=summary|detailed|full``,
``SHAPEPLAN_DIAGNOSTICS_FILE=path.json`` (the JSON report is written there at exit).
"""
from __future__ import annotations

from shapeplan.diagnostics.core import (CATEGORIES, LEVELS, RING_SIZE, Category, Event, Level, configure_from_env,
                                          counters, disable, enable, enabled, events, is_enabled, muted, record,
                                          reset, segment_records, segment_terminal)
from shapeplan.diagnostics.report import report, write_report

__all__ = ["CATEGORIES", "LEVELS", "RING_SIZE", "Category", "Event", "Level", "configure_from_env", "counters",
           "disable", "enable", "enabled", "events", "is_enabled", "muted", "record", "report", "reset",
           "segment_records", "segment_terminal", "write_report"]
