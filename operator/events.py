"""Kubernetes Events on the operator's objects (what `kubectl describe agent` shows under Events).

Posted with the operator's own client from its reconcile workers (kopf's poster only works inside
kopf's per-object handlers). Best effort: an Event that cannot be posted is logged, and the
reconcile that wanted it carries on.
"""

from __future__ import annotations

import datetime
import logging
import socket
from typing import Any

from rockbot.kube import EVENTS, ApiError, KubeClient

logger = logging.getLogger(__name__)
COMPONENT = "rockbot-operator"
#: The API server refuses longer messages.
MAX_MESSAGE = 1024


class EventPoster:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._instance = socket.gethostname()

    async def __call__(self, body: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        metadata = body["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata["namespace"]},
            "involvedObject": {
                "apiVersion": body.get("apiVersion") or "rockbot.dev/v1alpha1",
                "kind": body.get("kind") or "Agent",
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata.get("uid"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._kube.create(EVENTS, namespace=metadata["namespace"], body=event)
        except ApiError as error:
            logger.warning("could not post the %s event %s on %s: %s", event_type, reason, metadata["name"], error)
