"""The JSON report: configuration, per-category counters, per-segment terminal records, last events."""
from __future__ import annotations

import json
import os
from typing import Any

from shapeplan.diagnostics import core as _ev


def report(max_events: int | None = 1000) -> dict[str, Any]:
    """A JSON-able dict of the diagnostics state (the newest ``max_events`` events; None: all)."""
    evs = _ev.events()
    if max_events is not None:
        evs = evs[-max_events:] if max_events else []
    counts = _ev.counters()
    return {"format": "shapeplan.diagnostics/1", "config": _ev.current_config(),
            "counters": counts, "total_events": sum(counts.values()),
            "retained_events": len(_ev.events()), "segments": _ev.segment_records(),
            "events": [e.to_json() for e in evs]}


def write_report(path: str, max_events: int | None = None) -> str:
    """Write the JSON report atomically (temp file + rename); returns the path."""
    data = report(max_events)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
    return path


def _write_at_exit() -> None:
    path = _ev.current_file()
    if path:
        try:
            write_report(path)
        except OSError:
            pass
