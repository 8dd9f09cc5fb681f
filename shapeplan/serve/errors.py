"""Serving errors and the protocol status each one maps to (one table, first match wins).

A handler never matches on a message: it looks the exception's class up in ``STATUS``."""
from __future__ import annotations

from typing import NamedTuple

from shapeplan.errors import InputError, ShapeplanError


class ServeError(ShapeplanError):
    """Base class of the serving layer's own errors."""


class ModelNotFoundError(ServeError):
    """No model (or no such version of it) is served under that name."""


class UnavailableError(ServeError):
    """The server is shutting down or the model is not ready."""


class ModelLoadError(ServeError):
    """A model could not be loaded at a client's request (its file, its config, its compilation)."""


class BadRequestError(InputError):
    """The request itself is malformed: not JSON / protobuf, a missing field, contents that do not
    match the declared datatype or shape, a byte length that does not add up."""


class RequestTooLargeError(InputError):
    """The request body is over the server's limit (``--max-request-bytes``)."""


class Status(NamedTuple):
    http: int
    grpc: str       # a grpc.StatusCode member name (grpc is imported only by the gRPC server)


STATUS: tuple[tuple[type[BaseException], Status], ...] = (
    (ModelNotFoundError, Status(404, "NOT_FOUND")),
    (ModelLoadError, Status(400, "INVALID_ARGUMENT")),    # as Triton answers a load that fails
    (RequestTooLargeError, Status(413, "RESOURCE_EXHAUSTED")),
    (InputError, Status(400, "INVALID_ARGUMENT")),        # wrong name / dtype / shape, malformed request
    (UnavailableError, Status(503, "UNAVAILABLE")),
    (ShapeplanError, Status(500, "INTERNAL")),            # a kernel failed on this request's values
)
INTERNAL = Status(500, "INTERNAL")


def status_of(e: BaseException) -> Status:
    for cls, status in STATUS:
        if isinstance(e, cls):
            return status
    return INTERNAL


def describe(e: BaseException) -> str:
    """The message a client sees: ours as is; anything unexpected with its type (no traceback)."""
    if isinstance(e, ShapeplanError):
        return str(e)
    return f"internal error: {type(e).__name__}: {e}"
