"""API errors as the real API server words them, rendered as `Status` objects."""

import json
from typing import Any

import aiohttp.web


class StatusError(Exception):
    """Ends a request with a `Status` answer: code, CamelCase reason, and the server's message."""

    def __init__(self, *, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        """The `Status` object, also sent as the object of an ERROR watch event."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    def response(self) -> aiohttp.web.Response:
        return aiohttp.web.Response(
            status=self.code, text=json.dumps(self.status()), content_type="application/json"
        )


def qualified(*, group: str, plural: str) -> str:
    """`pods` for the core group, `agents.rockbot.dev` otherwise: how messages name a resource."""
    return f"{plural}.{group}" if group else plural


def not_found(*, group: str, plural: str, name: str) -> StatusError:
    return StatusError(
        code=404,
        reason="NotFound",
        message=f'{qualified(group=group, plural=plural)} "{name}" not found',
        details={"name": name, "group": group, "kind": plural},
    )


def resource_not_found() -> StatusError:
    return StatusError(code=404, reason="NotFound", message="the server could not find the requested resource",
                       details={})


def already_exists(*, group: str, plural: str, name: str) -> StatusError:
    return StatusError(
        code=409,
        reason="AlreadyExists",
        message=f'{qualified(group=group, plural=plural)} "{name}" already exists',
        details={"name": name, "group": group, "kind": plural},
    )


def conflict(*, group: str, plural: str, name: str, why: str) -> StatusError:
    return StatusError(
        code=409,
        reason="Conflict",
        message=f'Operation cannot be fulfilled on {qualified(group=group, plural=plural)} "{name}": {why}',
        details={"name": name, "group": group, "kind": plural},
    )


def stale(*, group: str, plural: str, name: str) -> StatusError:
    return conflict(
        group=group,
        plural=plural,
        name=name,
        why="the object has been modified; please apply your changes to the latest version and try again",
    )


def invalid(*, kind: str, group: str, name: str, causes: list[tuple[str, str, str]]) -> StatusError:
    """422 naming every bad field: causes are (field, reason, message) like `("spec.x", "FieldValueRequired",
    "Required value")`."""
    texts = [f"{field}: {message}" if field else message for field, _, message in causes]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified_kind = f"{kind}.{group}" if group else kind
    return StatusError(
        code=422,
        reason="Invalid",
        message=f'{qualified_kind} "{name}" is invalid: {summary}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": reason, "message": message, "field": field} for field, reason, message in causes],
        },
    )


def bad_request(message: str) -> StatusError:
    return StatusError(code=400, reason="BadRequest", message=message)


def gone(message: str) -> StatusError:
    return StatusError(code=410, reason="Expired", message=message)


def forbidden(message: str) -> StatusError:
    return StatusError(code=403, reason="Forbidden", message=message)


def method_not_allowed(message: str) -> StatusError:
    return StatusError(code=405, reason="MethodNotAllowed", message=message)


def unsupported_media_type(content_type: str) -> StatusError:
    return StatusError(
        code=415,
        reason="UnsupportedMediaType",
        message=(
            f"the body of the request was in an unknown format ({content_type or 'no content type'}) - "
            "accepted media types include: application/json-patch+json, application/merge-patch+json "
            "(the emulator does not implement strategic-merge or server-side apply patches)"
        ),
    )
