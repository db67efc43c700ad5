"""Whoever is alive cleans up after a dead scripts-manager instance, within seconds.

Each instance (one process: a restarted process is a new instance) holds a Lease in the scripts namespace,
named after its pod, its random id as holderIdentity, renewed every third of ROCKBOT_SCRIPTS_LEASE_SECONDS.
Every pod it makes or claims carries that id (`MANAGER_LABEL`), and a job's pod who waits for the answer
(`ASKER_ANNOTATION`, see pod_manifests.py). Each renewal, an instance also lists the others' Leases:

- A Lease this instance has seen unchanged for its duration (judged on its own clock, never the holder's:
  `LeaseObserver`) belongs to a dead instance. Its pods are deleted at once, each job among them becomes an
  `Orphan` for the service to answer on its asker's reply queue with a retryable error ("the scripts-manager
  running this script stopped; the script may have run in part"), then its Lease is deleted.
- A process that finds its pod's Lease held by another id at start knows that instance is dead (a container
  restarts only once its process has ended) and reaps it at once, without waiting for the Lease to expire.
- A 401 (`Unauthorized`: this process's token was revoked, its pod deleted) is told to `on_revoked` at once, and
  the loop ends: the process stops (service.py), and the others clean up after it when its Lease expires.
- The sweep (at start and every ROCKBOT_SCRIPTS_SWEEP_INTERVAL_SECONDS) reaps the pods of an instance that has
  no Lease at all any more, deletes every ended pod nobody reads any more (an idle one, or one of this instance's
  that no job of its uses: `in_use`; a live instance deletes its job pods on every path itself, and retries, so
  this is for a delete that failed), and any pod past its deadline plus ROCKBOT_SCRIPTS_SWEEP_GRACE_SECONDS (one
  its live instance failed to delete, or one made before instances held Leases).

A pod is deleted on the resourceVersion seen (re-read on a conflict), so a warm pod a live instance claimed
meanwhile is left alone, and of two instances reaping one dead one, exactly one deletes each pod and answers
its job. A reaped job is remembered (`reaped`): the copy of its request that the broker redelivers is answered
the same way instead of running the script again.

This is the lifecycle any pod the manager makes for a client can reuse (the code interpreter's session pods):
mark it with `MANAGER_LABEL` and, if somebody waits on it, `ASKER_ANNOTATION` and `REQUEST_ANNOTATION`; when its
instance dies, whoever is alive deletes it and answers the asker.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

import aiohttp

from rockbot.kube import LEASES, PODS, ApiError, Conflict, K8sObject, KubeClient, NotFound, Unauthorized
from rockbot.kube.leases import HeldLease, LeaseObserver, holder_of
from rockbot.scripts_manager.backends import CredentialsRevoked, Orphan
from rockbot.scripts_manager.backends.pod_manifests import (
    DEADLINE_ANNOTATION,
    IDLE,
    MANAGER_LABEL,
    REQUEST_ANNOTATION,
    SANDBOX_SELECTOR,
    STATE_LABEL,
    asker_of,
    ended,
    now_utc,
    request_key,
)
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import ScriptsManagerSettings

log = logging.getLogger(__name__)

LEASE_LABELS = {"app.kubernetes.io/managed-by": "rockbot-scripts-manager", "rockbot.dev/lease": "scripts-manager"}
LEASE_SELECTOR = ",".join(f"{key}={value}" for key, value in LEASE_LABELS.items())
#: Reaped jobs remembered for the copies of their requests the broker redelivers.
_REMEMBERED = 4096
#: Tries to delete a pod whose resourceVersion keeps moving (its node writes its status) before the next round.
_DELETE_TRIES = 3


def lease_name(owner: str) -> str:
    """The Lease of the instance running in pod (or, outside a pod, with id) `owner`: a DNS subdomain name."""
    name = f"rockbot-scripts-manager.{owner}"
    return name if len(name) <= 253 else f"rockbot-scripts-manager.{hashlib.sha256(owner.encode()).hexdigest()}"


class Reaper:
    """This instance's Lease, and the cleaning up after instances that died."""

    def __init__(
        self, *, kube: KubeClient, settings: ScriptsManagerSettings, metrics: ScriptMetrics,
        on_revoked: Callable[[CredentialsRevoked], None] | None = None,
    ) -> None:
        self._kube = kube
        self._on_revoked = on_revoked
        self._settings = settings
        self._metrics = metrics
        self._namespace = settings.scripts_namespace
        #: This instance's id: its Lease's holderIdentity and the `MANAGER_LABEL` of every pod it answers for.
        self.instance = secrets.token_hex(5)
        self.lease = HeldLease(
            kube=kube, namespace=self._namespace, name=lease_name(settings.pod_name or self.instance),
            holder=self.instance, duration_seconds=settings.scripts_lease_seconds, labels=LEASE_LABELS,
        )  # fmt: skip
        #: Set once the Lease is held: no pod is marked with this instance's id before (a sweep would take it
        #: for a dead instance's). `tried` is set after the first try, `problem` says why the last one failed.
        self.held = asyncio.Event()
        self.tried = asyncio.Event()
        self.problem: str | None = None
        #: Jobs of dead instances, for the service to answer.
        self.orphans: asyncio.Queue[Orphan] = asyncio.Queue()
        self._reaped: OrderedDict[str, Orphan] = OrderedDict()
        #: This instance's pods a job of its runs on or reads (the pod backend keeps it): the sweep leaves them be.
        self.in_use: set[str] = set()
        self._observer = LeaseObserver()

    def reaped(self, *, user: str, request_id: str) -> Orphan | None:
        """The reaped job of this request, if this instance reaped it."""
        return self._reaped.get(request_key(user=user, request_id=request_id))

    async def run(self) -> None:
        """Hold this instance's Lease and clean up after dead instances, until cancelled."""
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        while True:
            try:
                if not self.lease.held:
                    try:
                        await self._take()
                    except (ApiError, aiohttp.ClientError, OSError) as exc:
                        self.problem = str(exc)
                        raise
                    finally:
                        self.tried.set()
                else:
                    await self.lease.renew()
                await self._reap_expired()
                if loop.time() >= next_sweep:
                    await self.sweep()
                    next_sweep = loop.time() + self._settings.scripts_sweep_interval_seconds
            except Unauthorized as exc:
                if self._on_revoked is not None:
                    self._on_revoked(CredentialsRevoked(
                        f"the Kubernetes API no longer accepts this scripts-manager's credentials ({exc}): its pod "
                        "or ServiceAccount was deleted", may_have_run=False))
                    return
                log.warning("keeping this scripts-manager's Lease failed: %s", exc)
            except (ApiError, aiohttp.ClientError, OSError) as exc:
                log.warning("keeping this scripts-manager's Lease or cleaning up after others failed: %s", exc)
            await asyncio.sleep(self.lease.duration_seconds / 3)

    async def _take(self) -> None:
        previous = await self.lease.take()
        self.held.set()
        self.problem = None
        if previous:
            log.warning("this pod's previous scripts-manager process (instance %s) stopped without cleaning up; "
                        "cleaning up after it", previous)
            await self.reap_instance(previous)

    async def _reap_expired(self) -> None:
        leases = (await self._kube.list(LEASES, namespace=self._namespace, label_selector=LEASE_SELECTOR)).items
        self._observer.keep_only(lease["metadata"]["name"] for lease in leases)
        for lease in leases:
            if lease["metadata"]["name"] == self.lease.name or not self._observer.expired(lease):
                continue
            holder = holder_of(lease)
            log.warning("scripts-manager instance %s has not renewed its Lease %s for %s s: cleaning up after it",
                        holder, lease["metadata"]["name"], lease["spec"].get("leaseDurationSeconds"))
            if holder:
                await self.reap_instance(holder)
            with contextlib.suppress(Conflict, NotFound):  # renewed after all, or another instance was faster
                await self._kube.delete(LEASES, namespace=self._namespace, name=lease["metadata"]["name"],
                                        preconditions_resource_version=lease["metadata"]["resourceVersion"])

    async def reap_instance(self, instance: str) -> int:
        """Delete the pods of the dead `instance` and hand their jobs on as orphans; returns how many were deleted."""
        listed = await self._kube.list(PODS, namespace=self._namespace,
                                       label_selector=f"{SANDBOX_SELECTOR},{MANAGER_LABEL}={instance}")
        reaped = [pod for pod in listed.items if await self._reap(pod, dead=instance)]
        return len(reaped)

    async def _reap(self, pod: K8sObject, *, dead: str) -> bool:
        """Delete `pod` while it is still the dead instance's; if this did, hand its job on. True when deleted."""
        name = pod["metadata"]["name"]
        asker = asker_of(pod)
        request_id = (pod["metadata"].get("annotations") or {}).get(REQUEST_ANNOTATION)
        orphan, key = None, ""
        if asker is not None and request_id:  # known as reaped before the delete: a copy redelivered meanwhile
            orphan = Orphan(request_id=request_id, asker=asker, pod=name, manager=dead)  # must not run again
            key = request_key(user=asker.user, request_id=request_id)
            self._reaped[key] = orphan
        if not await self._delete_while_dead(pod, dead=dead):
            self._reaped.pop(key, None)
            return False
        self._metrics.reaped.labels("job" if orphan else "idle").inc()
        log.info("deleted script pod %s of the dead scripts-manager instance %s", name, dead)
        if orphan is not None:
            while len(self._reaped) > _REMEMBERED:
                self._reaped.popitem(last=False)
            self.orphans.put_nowait(orphan)
        return True

    async def _delete_while_dead(self, pod: K8sObject, *, dead: str) -> bool:
        """Delete `pod` on the resourceVersion seen while it is still `dead`'s; False when it is not (claimed by a
        live instance, gone, or still changing after the tries)."""
        name = pod["metadata"]["name"]
        for _ in range(_DELETE_TRIES):
            if (pod["metadata"].get("labels") or {}).get(MANAGER_LABEL) != dead:
                return False  # claimed by a live instance meanwhile
            try:
                await self._kube.delete(PODS, namespace=self._namespace, name=name, grace_period_seconds=0,
                                        preconditions_resource_version=pod["metadata"]["resourceVersion"])
                return True
            except NotFound:
                return False  # gone, or another instance reaped it first (and answers its job)
            except Conflict:
                try:
                    pod = await self._kube.get(PODS, namespace=self._namespace, name=name)
                except NotFound:
                    return False
        return False  # the next round tries again

    async def sweep(self, *, now: datetime | None = None) -> int:
        """Reap pods of instances without a Lease, delete pods past their deadline plus the grace; returns how many
        were deleted."""
        now = now or now_utc()
        # Pods first: a pod listed was made after its instance's Lease existed, so a live instance's Lease is in
        # the list that follows.
        pods = (await self._kube.list(PODS, namespace=self._namespace, label_selector=SANDBOX_SELECTOR)).items
        leases = (await self._kube.list(LEASES, namespace=self._namespace, label_selector=LEASE_SELECTOR)).items
        known = {holder_of(lease) for lease in leases} | {self.instance}
        deleted = 0
        for pod in pods:
            manager = (pod["metadata"].get("labels") or {}).get(MANAGER_LABEL)
            if manager and manager not in known:
                deleted += await self._reap(pod, dead=manager)
            elif self._unread(pod) or _past_deadline(pod, now=now, grace=self._settings.scripts_sweep_grace_seconds):
                with contextlib.suppress(NotFound, Conflict):  # gone, or changed (claimed) since listed
                    await self._kube.delete(PODS, namespace=self._namespace, name=pod["metadata"]["name"],
                                            grace_period_seconds=0,
                                            preconditions_resource_version=pod["metadata"]["resourceVersion"])
                    deleted += 1
                    self._metrics.swept.inc()
                    log.info("swept leftover script pod %s", pod["metadata"]["name"])
        return deleted

    def _unread(self, pod: K8sObject) -> bool:
        """An ended pod nobody reads any more: idle (no job on it), or this instance's and no job of its uses it."""
        labels = pod["metadata"].get("labels") or {}
        mine = labels.get(MANAGER_LABEL) == self.instance and pod["metadata"]["name"] not in self.in_use
        return ended(pod) and (labels.get(STATE_LABEL) == IDLE or mine)

    async def release(self) -> None:
        """At a clean stop, once this instance's pods are gone: nobody needs to clean up after it."""
        with contextlib.suppress(ApiError, aiohttp.ClientError, OSError):
            await self.lease.release()


def _past_deadline(pod: K8sObject, *, now: datetime, grace: float) -> bool:
    metadata = pod["metadata"]
    stamp = (metadata.get("annotations") or {}).get(DEADLINE_ANNOTATION) or metadata.get("creationTimestamp")
    try:
        return (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds() > grace
    except (AttributeError, TypeError, ValueError):
        return True
