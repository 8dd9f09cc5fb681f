"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and the HTTP status of
each: one table from exception class to status (first match wins), so no handler reads a message."""
from __future__ import annotations

from typing import NamedTuple

from shapeplan.errors import CapacityError, InputError, ModelError, QueueFullError, ShapeplanError


class APIError(ShapeplanError):
    """An error the server answers with on purpose; ``param`` names the request field at fault."""
    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class BadRequest(APIError):
    """Malformed JSON, a wrong type, an unknown field, a value out of range, a prompt too long."""


class Unsupported(BadRequest):
    """A parameter OpenAI has and this server does not implement (named, so the client knows which)."""
    code = "unsupported_parameter"


class ModelNotFound(APIError):
    status = 404
    code = "model_not_found"


class NotFound(APIError):
    status = 404
    code = "not_found"


class MethodNotAllowed(APIError):
    status = 405
    code = "method_not_allowed"


class BodyTooLarge(APIError):
    status = 413
    code = "request_too_large"


class Unauthorized(APIError):
    status = 401
    code = "invalid_api_key"


class Status(NamedTuple):
    http: int
    type: str
    code: str | None


STATUS: tuple[tuple[type[BaseException], Status], ...] = (
    (QueueFullError, Status(503, "server_error", "queue_full")),          # with Retry-After
    (CapacityError, Status(400, "invalid_request_error", None)),        # more KV blocks than the pool has
    (InputError, Status(400, "invalid_request_error", None)),             # the engine refused the request
    (ModelError, Status(400, "invalid_request_error", None)),             # e.g. the chat template raised
)
INTERNAL = Status(500, "server_error", None)


def status_of(e: BaseException) -> Status:
    if isinstance(e, APIError):
        return Status(e.status, e.type, e.code)
    for cls, status in STATUS:
        if isinstance(e, cls):
            return status
    return INTERNAL


def body(e: BaseException) -> dict:
    """The error JSON of ``e``: our own messages as they are; anything unexpected by its type only."""
    st = status_of(e)
    message = str(e) if isinstance(e, ShapeplanError) else f"internal error: {type(e).__name__}: {e}"
    return {"error": {"message": message, "type": st.type, "param": getattr(e, "param", None), "code": st.code}}


def headers(e: BaseException) -> dict[str, str]:
    return {"Retry-After": "1"} if isinstance(e, QueueFullError) else {}
