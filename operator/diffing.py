"""Compare what should exist with what does: the desired manifest must be contained in the live object.

The API server adds defaults (strategy, terminationMessagePath, ...) and canonicalises quantities
(`0.5` becomes `500m`); neither is a difference worth a write.
"""

from __future__ import annotations

import decimal
import re
from typing import Any

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIXES = {
    "": 1,
    "m": decimal.Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


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
    match = _QUANTITY.match(str(value))
    if match is None or match.group(2) not in _SUFFIXES:
        return value
    return decimal.Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
