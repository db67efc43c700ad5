"""Kubernetes resource quantities (`250m`, `0.5`, `128Mi`, `1G`) as exact numbers.

The API server canonicalises quantities (`0.5` becomes `500m`), so code that compares what it
asked for with what it holds, or checks a request against a maximum, compares numbers, not text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([a-zA-Z]*)$")
_SUFFIXES: dict[str, Decimal | int] = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip


def parse_quantity(quantity: str | int) -> Decimal:
    """The quantity's value (`128Mi` is 134217728, `250m` is 0.25); ValueError if it is not one."""
    match = _QUANTITY.match(str(quantity).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity such as 250m, 0.5, 128Mi or 1G")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation as exc:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity such as 250m, 0.5, 128Mi or 1G") from exc
