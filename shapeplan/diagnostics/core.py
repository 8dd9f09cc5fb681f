"""Event recording: categories, levels, the 65,536-event ring buffer and counters.

The hot path is ``record``: when diagnostics are off it is one global lookup and a return. When on, a
category filter and a level filter run before anything is allocated. Counters are per category and
count every accepted event, so they stay right after the ring buffer wraps around.
"""
from __future__ import annotations

import collections
import contextlib
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

RING_SIZE = 65_536


class Category(str, enum.Enum):
    COMPILE = "COMPILE"
    EXECUTE = "EXECUTE"
    TIMING = "TIMING"
    MEMORY = "MEMORY"
    SHAPE = "SHAPE"
    SEGMENT = "SEGMENT"
    FUSION = "FUSION"
    VERIFY = "VERIFY"
    KV_CACHE = "KV_CACHE"
    FALLBACK = "FALLBACK"
    TRANSFER = "TRANSFER"
    MULTI_DEVICE = "MULTI_DEVICE"
    GRAPH_REPLAY = "GRAPH_REPLAY"
    LIFECYCLE = "LIFECYCLE"
    CACHE = "CACHE"
    OPTIMIZE = "OPTIMIZE"
    IMPORT = "IMPORT"
    LLM = "LLM"
    SERVE = "SERVE"
    PARALLEL = "PARALLEL"
    ERROR = "ERROR"


class Level(enum.IntEnum):
    SUMMARY = 0
    DETAILED = 1
    FULL = 2

    @classmethod
    def parse(cls, value: "str | int | Level") -> "Level":
        if isinstance(value, Level):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            raise ValueError(f"unknown diagnostics level {value!r}; choose summary, detailed or full") from None


CATEGORIES = tuple(c.value for c in Category)
LEVELS = ("summary", "detailed", "full")


@dataclass(slots=True)
class Event:
    seq: int
    t: float                   # time.perf_counter() seconds
    category: str
    level: int
    message: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "t": round(self.t, 9), "category": self.category,
                "level": LEVELS[self.level], "message": self.message,
                "fields": {k: _jsonable(v) for k, v in self.fields.items()}}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, enum.Enum):
        return v.value if isinstance(v.value, (str, int)) else v.name
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


class _State:
    __slots__ = ("on", "all", "cats", "level", "ring", "counts", "seq", "lock", "segments", "file", "t0")

    def __init__(self) -> None:
        self.on = False
        self.all = False
        self.cats: frozenset[str] = frozenset()
        self.level = Level.SUMMARY
        self.ring: collections.deque[Event] = collections.deque(maxlen=RING_SIZE)
        self.counts: dict[str, int] = {}
        self.seq = 0
        self.lock = threading.Lock()
        self.segments: dict[tuple[str, int], dict[str, Any]] = {}
        self.file: str | None = None
        self.t0 = time.perf_counter()


_S = _State()
_thread = threading.local()          # .muted: events of this thread are not recorded


@contextlib.contextmanager
def muted() -> Iterator[None]:
    """Record no events from this thread inside the block (e.g. a background warm-up whose plans and
    calls are not the user's)."""
    before = getattr(_thread, "muted", False)
    _thread.muted = True
    try:
        yield
    finally:
        _thread.muted = before


def record(category: "str | Category", message: str, level: "str | int | Level" = 0, **fields: Any) -> None:
    """Record one event. Free (one check) when diagnostics are disabled.

    ``level``: the least verbose level at which the event is kept (summary events are always kept when
    their category is enabled; ``full`` events only at level full).
    """
    s = _S
    if not s.on or getattr(_thread, "muted", False):
        return
    cat = category.value if isinstance(category, Category) else str(category).upper()
    if not s.all and cat not in s.cats:
        return
    lv = level if type(level) is int else Level.parse(level)
    if lv > s.level:
        return
    with s.lock:
        s.seq += 1
        s.counts[cat] = s.counts.get(cat, 0) + 1
        s.ring.append(Event(s.seq, time.perf_counter() - s.t0, cat, int(lv), message, fields))


def is_enabled(category: "str | Category | None" = None, level: "str | int | Level" = 0) -> bool:
    """Would an event of this category and level be kept? (use to skip building costly fields)"""
    s = _S
    if not s.on:
        return False
    if category is not None:
        cat = category.value if isinstance(category, Category) else str(category).upper()
        if not s.all and cat not in s.cats:
            return False
    return Level.parse(level) <= s.level


def enabled() -> bool:
    return _S.on


def _parse_categories(categories: "str | Iterable[str | Category]") -> tuple[bool, frozenset[str]]:
    if isinstance(categories, (str, Category)):
        items = [categories.value] if isinstance(categories, Category) else str(categories).split(",")
    else:
        items = [c.value if isinstance(c, Category) else str(c) for c in categories]
    names = frozenset(i.strip().upper() for i in items if i.strip())
    return ("ALL" in names or "1" in names or "TRUE" in names), names


def enable(categories: "str | Iterable[str | Category]" = "ALL", level: "str | int | Level" = "summary",
           file: str | None = None) -> None:
    """Turn diagnostics on for ``categories`` ("ALL" or a list / comma-separated string)."""
    all_, names = _parse_categories(categories)
    unknown = sorted(n for n in names if n not in CATEGORIES and n not in ("ALL", "1", "TRUE"))
    _S.all, _S.cats, _S.level = all_, names, Level.parse(level)
    _S.on = bool(all_ or names)
    if unknown:
        record("ERROR", "unknown diagnostics categories accepted as custom", categories=unknown)
    if file is not None:
        _set_file(file)


def disable() -> None:
    _S.on = False


def reset() -> None:
    """Forget every event, counter and segment record (the configuration stays)."""
    with _S.lock:
        _S.ring.clear()
        _S.counts.clear()
        _S.segments.clear()
        _S.seq = 0


def events(category: "str | Category | None" = None) -> list[Event]:
    with _S.lock:
        evs = list(_S.ring)
    if category is None:
        return evs
    cat = category.value if isinstance(category, Category) else str(category).upper()
    return [e for e in evs if e.category == cat]


def counters() -> dict[str, int]:
    with _S.lock:
        return dict(_S.counts)


def segment_terminal(plan: str, segment: int, state: str, reason: str, **fields: Any) -> None:
    """Why a segment ended in its final state (kept whether or not diagnostics are enabled; rare)."""
    with _S.lock:
        _S.segments[(plan, segment)] = {"plan": plan, "segment": segment, "state": state, "reason": reason,
                                        **{k: _jsonable(v) for k, v in fields.items()}}
    record("SEGMENT", f"segment {segment} of {plan} -> {state}: {reason}", plan=plan, segment=segment,
           state=state, reason=reason)


def segment_records() -> list[dict[str, Any]]:
    with _S.lock:
        return list(_S.segments.values())


def current_file() -> str | None:
    return _S.file


def current_config() -> dict[str, Any]:
    return {"enabled": _S.on, "categories": "ALL" if _S.all else sorted(_S.cats),
            "level": LEVELS[_S.level], "ring_size": RING_SIZE, "file": _S.file}


def _set_file(path: str) -> None:
    import atexit
    first = _S.file is None
    _S.file = path
    if first:
        from shapeplan.diagnostics.report import _write_at_exit
        atexit.register(_write_at_exit)


def configure_from_env(environ: "dict[str, str] | None" = None) -> None:
    from shapeplan import env
    cats = env.get("SHAPEPLAN_DIAGNOSTICS", environ)
    level = env.get("SHAPEPLAN_DIAGNOSTICS_LEVEL", environ)
    path = env.get("SHAPEPLAN_DIAGNOSTICS_FILE", environ)
    if cats and cats[0].upper() not in ("0", "FALSE", "OFF", "NONE"):
        enable(cats, level=level, file=path)
    elif path:
        enable("ALL", level=level, file=path)


configure_from_env()
