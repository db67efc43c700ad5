"""Kubernetes Events as deliveries: which a Trigger selects, what names one, and the watches that find them.

Events repeat: the API server folds repeats into one object whose `count` (or `series.count`) grows,
and a controller may also write a new object for the same trouble. A delivery is one observation,
`<event uid>/<count>`; its incident is the object it is about and its reason, so a burst of either
kind wakes the agent once per de-duplication window (see `admission`). Events are watched only in the
namespaces some Trigger selects, and a watch stops when no Trigger needs it any more.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import Any

from rockbot.gateway.admission import Offer
from rockbot.gateway.catalog import Catalog, Entry
from rockbot.kube import EVENTS, KubeClient
from rockbot.kube.mirroring import mirror
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Event = dict[str, Any]


def matches(entry: Entry, event: Event) -> bool:
    source = entry.trigger.spec.kubernetes_events
    if source is None or event.get("type") != source.type:
        return False
    involved = event.get("involvedObject") or {}
    wanted = source.involved_object
    if wanted is not None and (
        (wanted.kind is not None and involved.get("kind") != wanted.kind)
        or (wanted.name is not None and involved.get("name") != wanted.name)
    ):
        return False
    return entry.reason is None or entry.reason.search(event.get("reason") or "") is not None


def offer_of(event: Event) -> Offer:
    metadata = event.get("metadata") or {}
    involved = event.get("involvedObject") or {}
    series = event.get("series") or {}
    count = series.get("count") or event.get("count") or 1
    namespace = involved.get("namespace") or metadata.get("namespace", "")
    incident = f"{involved.get('kind', '')}/{namespace}/{involved.get('name', '')}/{event.get('reason', '')}"
    return Offer(delivery_id=f"{metadata.get('uid', '')}/{count}", incident=incident, occurred=occurred_at(event))


def occurred_at(event: Event) -> datetime.datetime:
    """When the event last happened: the newest of the times it carries."""
    stamps = [
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ]
    parsed = [datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) for stamp in stamps if stamp]
    return max(parsed, default=datetime.datetime.min.replace(tzinfo=datetime.UTC))


def context_of(entry: Entry, event: Event) -> dict[str, Any]:
    return {"event": event, "trigger": {"namespace": entry.key[0], "name": entry.key[1]}}


class EventWatch:
    """One watch of Events per namespace some Trigger selects; `on_event(entry, event)` for each match."""

    def __init__(self, *, kube: KubeClient, catalog: Catalog, on_event: Callable[[Entry, Event], None]) -> None:
        self._kube = kube
        self._catalog = catalog
        self._on_event = on_event
        self._watches: dict[str, asyncio.Task[None]] = {}

    def update(self) -> None:
        """Start and stop watches to follow the catalog."""
        wanted = self._catalog.event_namespaces()
        for namespace in set(self._watches) - wanted:
            self._watches.pop(namespace).cancel()
        for namespace in wanted - set(self._watches):
            watching = mirror(kube=self._kube, resource=EVENTS, namespace=namespace,
                              on_upsert=self._observed, on_delete=lambda *_: None)  # fmt: skip
            self._watches[namespace] = asyncio.create_task(watching, name=f"watch events in {namespace}")
            log.info("watching Events in %s", namespace)

    async def stop(self) -> None:
        await cancel_and_wait(*self._watches.values())
        self._watches.clear()

    def _observed(self, event: Event) -> None:
        namespace = (event.get("metadata") or {}).get("namespace", "")
        for entry in self._catalog.watching(namespace):
            if matches(entry, event):
                self._on_event(entry, event)
