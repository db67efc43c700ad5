"""Leader election between operator replicas, on one Lease (coordination.k8s.io) in the operator's namespace.

Only the leader works: kopf, the reconcilers, the scheduler and the bus consumers (agents' scheduling requests,
token usage) all start after `acquire()` returns. A standby reads the Lease every `POLL_SECONDS` and takes it
when its holder released it (a clean stop writes an empty holder) or when it has seen the Lease unchanged for
`leaseDurationSeconds` on its own clock (`LeaseObserver`: a dead leader, SIGKILLed or its node gone). Every
write is conditional on the resourceVersion read, so two standbys never both win.

The leader renews every third of the duration. It gives up, and must stop working at once, when another holder
took the Lease or when it could not renew for two thirds of the duration (a standby may take over at one
duration, by a clock that started no earlier than the leader's last good renewal): `keep()` returns why.

Why not kopf's peering: it freezes kopf's resource handlers only, and rockbot's operator has none (its watches,
reconcilers and scheduler are its own, started by kopf's start-up handlers), so a frozen peer would go on
working; a Lease is also what platform teams already read (`kubectl get lease`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp

from rockbot.kube import LEASES, ApiError, Conflict, K8sObject, KubeClient, NotFound
from rockbot.kube.leases import LeaseObserver, claimed, holder_of, micro_time, renewed

log = logging.getLogger(__name__)

#: How often a standby reads the Lease: a dead leader's successor starts at most this much after its duration.
POLL_SECONDS = 1.0
#: Failures a request to the API may meet now and then: tried again, never fatal by themselves.
TRANSIENT_ERRORS = (ApiError, OSError, aiohttp.ClientError, TimeoutError)


class Leadership:
    """This process's claim on the Lease `namespace/name`, as `identity` (unique per process)."""

    def __init__(
        self, *, kube: KubeClient, namespace: str, name: str, identity: str, duration_seconds: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration_seconds = duration_seconds
        self._clock = clock
        self._current: K8sObject | None = None
        self._renewed = 0.0
        #: Who holds the Lease as this standby last read it ("" before the first read or when released).
        self.leader = ""

    async def acquire(self) -> None:
        """Return once this process holds the Lease; until then, a standby that reads it."""
        observer = LeaseObserver(clock=self._clock)
        while True:
            try:
                if await self._try_acquire(observer):
                    return
            except TRANSIENT_ERRORS as exc:
                log.warning("could not read or take the leader Lease %s/%s: %r; trying again", self.namespace,
                            self.name, exc)
            await asyncio.sleep(POLL_SECONDS)

    async def _try_acquire(self, observer: LeaseObserver) -> bool:
        started = self._clock()
        try:
            lease = await self._kube.get(LEASES, namespace=self.namespace, name=self.name)
        except NotFound:
            try:
                self._current = await self._kube.create(LEASES, namespace=self.namespace, body=self._body(None))
            except Conflict:  # another replica made it first
                return False
            return self._won(started, how="made it")
        holder = holder_of(lease)
        if holder not in ("", self.identity) and not observer.expired(lease):
            if holder != self.leader:
                log.info("standing by: the leader Lease %s/%s is held by %s", self.namespace, self.name, holder)
            self.leader = holder
            return False
        try:
            self._current = await self._kube.replace(LEASES, namespace=self.namespace, name=self.name,
                                                     body=self._body(lease))
        except (Conflict, NotFound):  # renewed, taken or deleted meanwhile: read it again
            return False
        if holder == self.identity:
            how = "held it already"
        else:
            how = f"took it over from {holder}, which stopped renewing it" if holder else "took it, released"
        return self._won(started, how=how)

    def _won(self, started: float, *, how: str) -> bool:
        self._renewed = started
        self.leader = self.identity
        log.info("leading: holding the Lease %s/%s (%s)", self.namespace, self.name, how)
        return True

    def _body(self, lease: K8sObject | None) -> K8sObject:
        return claimed(lease, namespace=self.namespace, name=self.name, holder=self.identity,
                       duration_seconds=self.duration_seconds)

    async def keep(self) -> str:
        """Renew the Lease while it is held; returns why leadership is lost (the caller stops working at once)."""
        deadline = self.duration_seconds * 2 / 3
        failing = False
        while True:
            await asyncio.sleep(POLL_SECONDS if failing else self.duration_seconds / 3)
            started = self._clock()
            try:
                lost = await self._renew()
            except TRANSIENT_ERRORS as exc:
                if self._clock() - self._renewed >= deadline:
                    return f"could not renew the Lease for {deadline:.1f} s (last error: {exc!r})"
                log.warning("could not renew the leader Lease %s/%s: %r; trying again", self.namespace, self.name,
                            exc)
                failing = True
                continue
            if lost:
                return lost
            self._renewed, failing = started, False

    async def _renew(self) -> str | None:
        """One renewal; returns why it failed for good (another holder), None when renewed."""
        assert self._current is not None, "renewing a Lease never acquired"
        try:
            self._current = await self._kube.replace(LEASES, namespace=self.namespace, name=self.name,
                                                     body=renewed(self._current))
            return None
        except NotFound:
            return "the Lease was deleted"
        except Conflict:
            current = await self._kube.get(LEASES, namespace=self.namespace, name=self.name)
            if holder_of(current) != self.identity:
                return f"the Lease is held by {holder_of(current) or 'nobody'} now"
        # changed by somebody else but still ours (a label, say): renew what is there now; a conflict again fails
        # this attempt (a transient error)
        self._current = await self._kube.replace(LEASES, namespace=self.namespace, name=self.name,
                                                 body=renewed(current))
        return None

    async def release(self) -> None:
        """Hand the Lease on at a clean stop: an empty holder, which a standby takes at its next read.

        A renewal cancelled by the stop may have been written all the same, so a conflict is read again: while
        the Lease is still this process's, it is released from what is there now.
        """
        current, self._current = self._current, None
        for _ in range(3):
            if current is None or holder_of(current) != self.identity:
                return
            spec = {**current["spec"], "holderIdentity": "", "renewTime": micro_time(datetime.now(UTC))}
            try:
                await self._kube.replace(LEASES, namespace=self.namespace, name=self.name,
                                         body={**current, "spec": spec})
            except NotFound:
                return
            except Conflict:
                current = await self._kube.get(LEASES, namespace=self.namespace, name=self.name)
                continue
            log.info("released the leader Lease %s/%s", self.namespace, self.name)
            return
