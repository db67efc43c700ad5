"""Errors of the API server as exceptions, one class per status code callers react to."""

import json
from typing import Any


class ApiError(Exception):
    """The API server refused a request; `reason` and `message` come from its `Status` answer."""

    def __init__(self, *, status: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.details = details or {}


class Unauthorized(ApiError):
    """401: the API server no longer accepts this client's credentials (its ServiceAccount token was revoked: the
    pod it was bound to, or its ServiceAccount, was deleted); no request of this process will succeed again."""


class NotFound(ApiError):
    """404: the object (or its namespace, or the resource itself) does not exist."""


class Conflict(ApiError):
    """409: `reason` is `AlreadyExists` on create, `Conflict` on a stale resourceVersion."""


class Gone(ApiError):
    """410: the resourceVersion to resume from is too old; list again and watch from there."""


class Invalid(ApiError):
    """422: the object or patch is invalid; `message` names the field and the rule."""


class Unavailable(ApiError):
    """The API server did not answer: unreachable, the connection broke, or no answer within the timeout.

    Raised by every request but a watch (a broken watch stream raises aiohttp's `ClientError`, as
    callers resume those): `status` is 504 (reason `Timeout`) for a timeout, 503 otherwise, so code
    treating 5xx answers as transient retries these too.
    """


class KubeConfigError(Exception):
    """No client can be built: no kubeconfig, a broken one, or a bad timeout; the message says the fix."""


_CLASSES: dict[int, type[ApiError]] = {401: Unauthorized, 404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}


def error_from_status(*, status: int, body: dict[str, Any] | None = None, text: str = "") -> ApiError:
    """Build the exception for an HTTP status and the `Status` object (or plain text) that came with it."""
    body = body if isinstance(body, dict) else {}
    status = int(body.get("code") or status)
    reason = str(body.get("reason") or _default_reason(status))
    message = str(body.get("message") or text.strip() or reason)
    cls = _CLASSES.get(status, ApiError)
    return cls(status=status, reason=reason, message=message, details=body.get("details"))


def error_from_text(*, status: int, text: str) -> ApiError:
    """Build the exception from a raw response body that may or may not be a JSON `Status`."""
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = None
    return error_from_status(status=status, body=body, text=text)


def _default_reason(status: int) -> str:
    reasons = {401: "Unauthorized", 404: "NotFound", 409: "Conflict", 410: "Gone", 422: "Invalid"}
    return reasons.get(status, f"HTTP{status}")
