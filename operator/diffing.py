"""Compare what should exist with what does: the desired manifest must be contained in the live object.

The API server adds defaults (strategy, terminationMessagePath, ...) and canonicalises quantities
(`0.5` becomes `500m`); neither is a difference worth a write.
"""

from __future__ import annotations

import decimal
from typing import Any

from rockbot.kube.quantity import parse_quantity


def contains(live: Any, desired: Any, *, path: tuple[str, ...] = ()) -> bool:
    """Whether every field of `desired` is present in `live` with an equal value."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            key in live and contains(live[key], value, path=(*path, key)) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(item, want, path=path) for item, want in zip(live, desired, strict=True))
        )
    if "resources" in path and isinstance(desired, str | int) and isinstance(live, str | int):
        return _quantity(live) == _quantity(desired)
    return live == desired


def _quantity(value: str | int) -> decimal.Decimal | str | int:
    try:
        return parse_quantity(value)
    except ValueError:
        return value
