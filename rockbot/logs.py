"""Logging for every process: one JSON object per line in clusters, plain text for people.

A record is never lost to its extras. kopf's per-object records carry `k8s_ref` (the object they are
about, written as `object`) and `settings`/`k8s_skip` meant for kopf's own formatter (left out: the
settings hold a queue that cannot be copied); any other value json cannot encode is written as text.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonEncoder, JsonFormatter

#: Extras kopf adds to its per-object records for its own formatter and event poster.
KOPF_PRIVATE_EXTRAS = ("settings", "k8s_skip")


class _NeverFailingEncoder(JsonEncoder):
    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except Exception:  # e.g. a dataclass holding something deepcopy refuses
            return f"<{type(o).__name__}>"


def json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "asctime": "time", "k8s_ref": "object"},
        reserved_attrs=[*RESERVED_ATTRS, *KOPF_PRIVATE_EXTRAS],
        json_encoder=_NeverFailingEncoder,
    )


def setup_logging(*, log_format: Literal["json", "text"] = "json", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(json_formatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
