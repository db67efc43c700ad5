"""Kubernetes Events on an object (what `kubectl describe` shows under Events), for every rockbot process.

An Event says what changed and why with a `reason` a person can search for (`kubectl get events
--field-selector reason=...`). Best effort: an Event that cannot be posted is logged, and the work
that wanted it carries on. Posting needs `events` `create` in the object's namespace, nothing more.
"""

from __future__ import annotations

import datetime
import logging
import socket
from typing import Any, Literal

from rockbot.kube.client import KubeClient
from rockbot.kube.errors import ApiError
from rockbot.kube.resources import EVENTS

log = logging.getLogger(__name__)

#: The API server refuses longer messages.
MAX_MESSAGE = 1024

EventType = Literal["Normal", "Warning"]


class EventPoster:
    """Posts Events as `component` (e.g. rockbot-operator), from this host."""

    def __init__(self, kube: KubeClient, *, component: str) -> None:
        self._kube = kube
        self._component = component
        self._instance = socket.gethostname()

    async def __call__(
        self, body: dict[str, Any], event_type: EventType, reason: str, message: str,
        annotations: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """An Event about `body` (any object with apiVersion, kind and metadata); `annotations` carry data for tools."""
        metadata = body["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"],
                         **({"annotations": annotations} if annotations else {})},
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata.get("uid"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._kube.create(EVENTS, namespace=metadata["namespace"], body=event)
        except (ApiError, OSError) as error:
            log.warning("could not post the %s event %s on %s %s: %s", event_type, reason, body["kind"],
                        metadata["name"], error)
