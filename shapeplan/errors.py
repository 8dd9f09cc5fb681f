"""Typed exceptions. Every message names the node / input, what was expected and what was given."""
from __future__ import annotations


class ShapeplanError(Exception):
    """Base class of every error shapeplan raises on purpose."""


class ModelError(ShapeplanError):
    """The model file or graph is malformed (corrupt bytes, dangling value, bad attribute, ...)."""


class UnsupportedOpError(ModelError):
    """A node uses an op (or an opset version of it) that the op table does not have."""


class InputError(ShapeplanError):
    """A feed is missing, extra, or has the wrong dtype / shape."""


class ShapeError(ShapeplanError):
    """Shape inference found two shapes that cannot both hold."""


class ExecutionError(ShapeplanError):
    """A kernel failed while running a node; the message says which node and the input shapes."""


class CacheError(ShapeplanError):
    """A plan cache entry is corrupt, foreign or from another build."""


class CaptureError(ShapeplanError):
    """Capturing or replaying a segment failed."""


class LifecycleError(ShapeplanError):
    """A plan was asked to do something its phase does not allow (e.g. a replaced weight)."""


class CapacityError(ShapeplanError):
    """A request cannot fit: more KV blocks or context than the serving engine has (the message says
    how many were needed and how many exist)."""


class QueueFullError(CapacityError):
    """The serving engine's queue of waiting requests is full (servers answer 503 with Retry-After)."""


class RequestAborted(ShapeplanError):
    """The request was aborted (``handle.abort()``, a client that went away) before it finished."""


class SwitchError(ShapeplanError, ValueError):
    """An environment switch (``shapeplan/env.py``) holds a value its type does not allow; the message
    names the variable, the value given and what is expected."""


class InjectedFault(ShapeplanError):
    """Raised on purpose by fault injection (``SHAPEPLAN_FAULT``, ``shapeplan.runtime.faults.inject``) at
    ``step`` (staging, allocation, capture); the engine recovers once the fault is cleared."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


class ConstraintError(InputError):
    """A structured-output constraint that cannot be used: a malformed schema, regex or grammar (the
    message names the problem, as xgrammar reports it), an unknown tool, or xgrammar missing."""
