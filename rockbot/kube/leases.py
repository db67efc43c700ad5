"""Leases (coordination.k8s.io/v1): a holder shows it lives by renewing one; whoever watches judges it expired.

A holder writes `spec.renewTime` every `leaseDurationSeconds / 3`, each write conditional on the resourceVersion
it last read. An observer never compares the holder's clock with its own: it calls a Lease expired once it has
seen the same resourceVersion for longer than `leaseDurationSeconds` on its own monotonic clock (as client-go's
leader election does), so a skewed clock can neither kill a live holder nor keep a dead one alive. The price: an
observer that has just started waits one duration before it judges a Lease it has not seen change.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from rockbot.kube.client import K8sObject, KubeClient
from rockbot.kube.errors import Conflict, NotFound
from rockbot.kube.resources import LEASES

log = logging.getLogger(__name__)


def micro_time(moment: datetime) -> str:
    """A `MicroTime` as the API server writes one (RFC 3339 in UTC, with microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder_of(lease: K8sObject) -> str:
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def claimed(
    lease: K8sObject | None, *, namespace: str, name: str, holder: str, duration_seconds: int,
    labels: dict[str, str] | None = None,
) -> K8sObject:
    """The body that makes `holder` hold a Lease: a new one when `lease` is None, else `lease` taken over (a
    transition counted when its holder changes); to be written conditionally on what was read."""
    now = micro_time(datetime.now(UTC))
    spec = {"holderIdentity": holder, "leaseDurationSeconds": duration_seconds, "acquireTime": now, "renewTime": now}
    if lease is None:
        metadata = {"name": name, "namespace": namespace, **({"labels": labels} if labels else {})}
        return {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": metadata,
                "spec": {**spec, "leaseTransitions": 0}}
    transitions = (lease["spec"].get("leaseTransitions") or 0) + (holder_of(lease) != holder)
    return {**lease, "spec": {**lease["spec"], **spec, "leaseTransitions": transitions}}


def renewed(lease: K8sObject) -> K8sObject:
    """`lease` with its `renewTime` moved to now: its holder still lives."""
    return {**lease, "spec": {**lease["spec"], "renewTime": micro_time(datetime.now(UTC))}}


class LeaseObserver:
    """Judges other holders' Leases by how long each has stayed unchanged, as this process saw it."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, tuple[str, float]] = {}  # name -> (resourceVersion, when this process first saw it)

    def expired(self, lease: K8sObject) -> bool:
        metadata = lease["metadata"]
        name, version, now = metadata["name"], metadata.get("resourceVersion", ""), self._clock()
        seen = self._seen.get(name)
        if seen is None or seen[0] != version:
            self._seen[name] = (version, now)
            return False
        duration = (lease.get("spec") or {}).get("leaseDurationSeconds") or 0
        return now - seen[1] > duration

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget the Leases that are gone."""
        kept = set(names)
        self._seen = {name: seen for name, seen in self._seen.items() if name in kept}


class HeldLease:
    """One Lease this process holds: taken at start, renewed while it lives, deleted when it stops cleanly."""

    def __init__(
        self, *, kube: KubeClient, namespace: str, name: str, holder: str, duration_seconds: int,
        labels: dict[str, str],
    ) -> None:
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self.holder = holder
        self.duration_seconds = duration_seconds
        self._labels = labels
        self._current: K8sObject | None = None

    @property
    def held(self) -> bool:
        return self._current is not None

    async def take(self) -> str | None:
        """Hold the Lease, taking it over from whoever held it before; returns that holder (None: nobody).

        Only for a Lease named after something that cannot have two live holders (a pod: the process before
        this one in the same pod is dead, as a container restarts only once its process has ended).
        """
        claim = {"namespace": self.namespace, "name": self.name, "holder": self.holder,
                 "duration_seconds": self.duration_seconds}
        while True:
            try:
                self._current = await self._kube.create(LEASES, namespace=self.namespace,
                                                        body=claimed(None, labels=self._labels, **claim))
                return None
            except Conflict:  # AlreadyExists: this pod's process before this one held it
                pass
            try:
                current = await self._kube.get(LEASES, namespace=self.namespace, name=self.name)
            except NotFound:
                continue
            previous = holder_of(current)
            try:
                self._current = await self._kube.replace(LEASES, namespace=self.namespace, name=self.name,
                                                         body=claimed(current, **claim))
            except (Conflict, NotFound):
                continue
            return previous if previous != self.holder else None

    async def renew(self) -> bool:
        """Move `renewTime` on; False when the Lease had gone (deleted by an observer who judged this holder
        dead) and was made again."""
        if self._current is None:
            await self.take()
            return False
        try:
            self._current = await self._kube.replace(LEASES, namespace=self.namespace, name=self.name,
                                                     body=renewed(self._current))
            return True
        except (Conflict, NotFound) as exc:
            log.warning("the Lease %s/%s changed or went behind its holder's back (%s); taking it again",
                        self.namespace, self.name, exc.reason)
            self._current = None
            await self.take()
            return False

    async def release(self) -> None:
        """Delete the Lease (unless somebody else changed it since): this holder is done."""
        if self._current is None:
            return
        current, self._current = self._current, None
        with contextlib.suppress(Conflict, NotFound):
            await self._kube.delete(LEASES, namespace=self.namespace, name=self.name,
                                    preconditions_resource_version=current["metadata"]["resourceVersion"])
