"""The two patch formats the emulator accepts: JSON merge patch (RFC 7386) and JSON patch (RFC 6902)."""

import copy
from typing import Any

import jsonpatch
import jsonpointer

from tests.kubeapi.errors import StatusError, bad_request, unsupported_media_type

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, `null` removes a key, anything else replaces the value."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_patch(*, content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    """Apply a PATCH body by its content type; errors are the API server's 400/415/422 answers."""
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE:
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        return merge_patch(target, patch)
    if media == JSON:
        if not isinstance(patch, list):
            raise bad_request("a JSON patch must be a JSON array of operations")
        try:
            return jsonpatch.JsonPatch(patch).apply(copy.deepcopy(target))
        except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict, jsonpointer.JsonPointerException) as exc:
            raise _unprocessable(f"the server rejected our request due to an error in our request: {exc}") from exc
        except jsonpatch.InvalidJsonPatch as exc:
            raise bad_request(f"invalid JSON patch: {exc}") from exc
    raise unsupported_media_type(media)


def _unprocessable(message: str) -> StatusError:
    return StatusError(code=422, reason="Invalid", message=message)
