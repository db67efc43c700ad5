"""The warm pool: idle script pods per limits class, made ahead of demand, each used for one job.

Each manager keeps `size` idle pods of every class in ROCKBOT_SCRIPTS_POOL (labelled with the class,
its instance as keeper, state `idle`) and replaces those that are taken, die or grow too old; when
the instance dies, whoever is alive reaps them with the rest of its pods (reaping.py). A manager
takes only the idle pods it keeps, each for one job, in its own memory: nothing is written to the API
before the job (that write was half of a warm call's time). The claim's marks (state `claimed`, the
job's and its asker's, and activeDeadlineSeconds lowered to the pod's age plus the job's bound) are
patched beside the job as it is written, conditional on the pod still being idle with the deadline
seen. What that gives up: a replica's burst cannot borrow another replica's idle pods (each pool
refills at once instead), and when a manager dies in the milliseconds before a mark lands, its pod
is reaped as an idle one and the copy of the request the broker redelivers runs again (a script pod
has no network; a session's later calls make the same trade, pod_sessions.py). A mark the API
refuses is logged, and the job runs. A taken pod is never idle again. Running pods are taken first;
when none is, a pod still starting is (scheduled, not ended): its job waits for the rest of its
start, not for a whole new pod's. The pods a burst used are replaced all at once.

A job costs no attach either: the manager opens an attach session to each of its own idle pods as
soon as it runs (`held`), and a job that takes the pod writes on it (pods.py). Nothing else is written
on it; a session sends the runner a blank line every _KEEPALIVE_SECONDS, which it skips, so a
kubelet's idle-stream timeout (`streamingConnectionIdleTimeout`, as low as 5 minutes on hardened
nodes) never closes it. As `stdinOnce` makes the first session to end close the runner's stdin, a
held session is kept until its job is done or its pod ended, and a session lost while idle ends its
pod's runner: the pod ends and is replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

import aiohttp

from rockbot.kube import PODS, ApiError, Conflict, K8sObject, KubeClient, NotFound
from rockbot.kube.attach import AttachSession
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.backends.pod_cache import PodCache
from rockbot.scripts_manager.backends.pod_manifests import (
    CONTAINER,
    DEADLINE_SLACK_SECONDS,
    IDLE,
    MANAGER_LABEL,
    POOL_LABEL,
    POOL_SELECTOR,
    STATE_LABEL,
    claim_patch,
    ended,
    now_utc,
    pool_pod,
)
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import PoolClass, ScriptsManagerSettings
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

#: Pods a request tries to claim before it takes the cold path.
CLAIM_ATTEMPTS = 3
_RETRY_SECONDS = 5.0
_KEEPALIVE_SECONDS = 60.0
#: How often the pool looks again with no change seen (pods growing too old for the longest script).
_LOOK_AGAIN_SECONDS = 30.0
#: After giving its idle pods back for a pod the node had no room for, the pool makes none for this long.
GIVE_BACK_SECONDS = 60.0


@dataclass(eq=False)
class Held:
    """An attach session to an idle pod of this manager's, opened before any job (None once lost)."""

    session: AttachSession | None = None
    opened: asyncio.Event = field(default_factory=asyncio.Event)  # set once connected, or failed
    released: asyncio.Event = field(default_factory=asyncio.Event)  # set: the holder closes the session
    taken: bool = False  # a job of this manager's writes on it


class WarmPool:
    def __init__(
        self, *, kube: KubeClient, settings: ScriptsManagerSettings, metrics: ScriptMetrics, owner: str,
        ready: asyncio.Event,
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._metrics = metrics
        self._namespace = settings.scripts_namespace
        self.owner = owner  # this manager instance's id
        self._ready = ready  # set once the instance holds its Lease: no pod is made before
        self.classes = [pool for pool in settings.scripts_pool if pool.size > 0]
        self.cache = PodCache(kube=kube, namespace=self._namespace, selector=POOL_SELECTOR)
        self._taken: set[str] = set()  # idle-labelled pods of ours that a job took, until they are gone
        self._marking: set[asyncio.Task[None]] = set()
        self._starting: dict[str, tuple[PoolClass, int]] = {}  # pods this manager made, not seen running yet
        self._held: dict[str, Held] = {}
        self._holders: set[asyncio.Task[None]] = set()
        self._given_back_at: float | None = None  # the loop's clock at the last give_back
        for pool in self.classes:
            metrics.pool_size.labels(pool.label).set(pool.size)

    def class_of(self, job: ScriptJob) -> PoolClass | None:
        cpu, memory = job.cpu or self._settings.scripts_cpu, job.memory or self._settings.scripts_memory
        return next((pool for pool in self.classes if pool.fits(cpu=cpu, memory=memory)), None)

    async def claims(self, job: ScriptJob) -> AsyncIterator[str]:
        """Idle pods of this manager's taken for this job, one at a time (the caller asks for another if one
        failed); each one's marks are on their way."""
        pool = self.class_of(job)
        if pool is None:
            return
        tried: set[str] = set()
        for _ in range(CLAIM_ATTEMPTS):
            taken = self._take_one(pool, job, tried)
            if taken is None:
                return
            yield taken

    def _take_one(self, pool: PoolClass, job: ScriptJob, tried: set[str]) -> str | None:
        # A pod still starting is taken too (its runner is attached to as soon as it runs, see pods.py): it is
        # nearer to running than a new pod would be. Running pods first.
        now = now_utc()
        candidates = [pod for pod in self._idle(pool)
                      if _scheduled(pod) and not ended(pod) and pod["metadata"]["name"] not in tried]
        for pod in sorted(candidates, key=self._preference):
            name = pod["metadata"]["name"]
            tried.add(name)
            patch = claim_patch(pod=pod, job=job, now=now, manager=self.owner)
            if patch is None:  # too old for this job
                continue
            self._taken.add(name)  # in memory: nothing else of this manager's takes it, and the API hears of it below
            task = asyncio.create_task(self._mark(name, patch), name=f"mark warm pod {name}")
            self._marking.add(task)
            task.add_done_callback(self._marking.discard)
            self._metrics.pool_claims.labels(pool.label).inc()
            self.cache.notify()  # refill
            return name
        if not candidates:
            self._metrics.pool_misses.labels(pool.label, "empty").inc()
        return None

    async def _mark(self, name: str, patch: list[K8sObject]) -> None:
        """Patch a taken pod's claim marks on while its job is written (see the module's docstring)."""
        try:
            marked = await self._kube.patch(PODS, namespace=self._namespace, name=name, body=patch, patch_type="json")
        except NotFound:
            return  # its job is done, and the pod deleted, already
        except (ApiError, aiohttp.ClientError, OSError) as exc:
            log.warning("could not mark warm pod %s as its job's (%s); the job runs", name, exc)
            return
        if name in self.cache.pods:
            self.cache.pods[name] = marked  # not idle any more, whatever the watch has said so far

    def _preference(self, pod: K8sObject) -> tuple[bool, bool, str]:
        """Running pods first, then those with a session held, and the longest running (a container reported
        running a moment ago may still be starting its runner)."""
        held = self._held.get(pod["metadata"]["name"])
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        since = min((((s.get("state") or {}).get("running") or {}).get("startedAt") or "~" for s in statuses),
                    default="~")  # RFC 3339 times of one format sort as they happened
        return not _ready(pod), held is None or held.session is None, since

    async def take(self, name: str) -> Held | None:
        """The session held to a pod this job claimed, once open (None: none held, or it was lost); the job
        releases it when done."""
        held = self._held.get(name)
        if held is None:
            return None
        held.taken = True
        await held.opened.wait()  # bounded: the attach has the client's request timeout
        return held if held.session is not None else None

    def _hold_sessions(self, pods: list[K8sObject]) -> None:
        """Open a session to each of these (idle, ours) pods that runs; release those of pods that ended."""
        for pod in pods:
            name = pod["metadata"]["name"]
            if _ready(pod) and name not in self._held:
                self._held[name] = held = Held()
                task = asyncio.create_task(self._hold(name, held), name=f"hold a session to {name}")
                self._holders.add(task)
                task.add_done_callback(self._holders.discard)
        for name, held in list(self._held.items()):
            pod = self.cache.pods.get(name)
            if pod is None or ended(pod) or pod["metadata"].get("deletionTimestamp"):
                held.released.set()

    async def _hold(self, name: str, held: Held) -> None:
        try:
            async with self._kube.attach(namespace=self._namespace, name=name, container=CONTAINER) as session:
                held.session = session
                held.opened.set()
                while not held.released.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_KEEPALIVE_SECONDS):
                            await held.released.wait()
                    if not held.taken and not held.released.is_set():
                        await session.write(b"\n")
        except (ApiError, aiohttp.ClientError, OSError) as exc:  # its pod's runner ends: the pool replaces it
            log.info("the session held to warm pod %s ended: %r", name, exc)
        finally:
            if not held.taken:
                held.session = None
            held.opened.set()
            if self._held.get(name) is held:
                del self._held[name]

    async def started(self, name: str) -> K8sObject | None:
        """A claimed pod once the pool's watch shows its container running or ended; None once it is gone."""
        while True:
            seen = self.cache.version
            pod = self.cache.pods.get(name)
            if pod is None or _ready(pod) or ended(pod) or pod["metadata"].get("deletionTimestamp"):
                return pod
            await self.cache.changed(since=seen, within=_RETRY_SECONDS)

    def _idle(self, pool: PoolClass) -> list[K8sObject]:
        """This manager's pods of the class that no job took."""
        self._taken &= self.cache.pods.keys()  # a taken pod is forgotten once gone
        return [
            pod for name, pod in self.cache.pods.items()
            if (labels := pod["metadata"].get("labels") or {}).get(POOL_LABEL) == pool.label
            and labels.get(STATE_LABEL) == IDLE
            and labels.get(MANAGER_LABEL) == self.owner
            and not pod["metadata"].get("deletionTimestamp")
            and name not in self._taken
        ]  # fmt: skip

    async def run(self) -> None:
        """Keep every class at its size until cancelled: on each change of the pool, and every little while."""
        if not self.classes:
            return
        await self._ready.wait()
        while True:
            await self.cache.synced.wait()
            seen = self.cache.version
            try:
                for pool in self.classes:
                    await self._maintain(pool)
            except ApiError as exc:  # quota exceeded, API down: keep what there is, try again soon
                log.warning("keeping the warm pool failed: %s; trying again in %g s", exc, _RETRY_SECONDS)
                await asyncio.sleep(_RETRY_SECONDS)
            except OSError as exc:
                log.warning("the Kubernetes API is unreachable (%s); trying again in %g s", exc, _RETRY_SECONDS)
                await asyncio.sleep(_RETRY_SECONDS)
            await self.cache.changed(since=seen, within=_LOOK_AGAIN_SECONDS)

    def _note_started(self) -> None:
        """How long each pod this manager made took to run: a `warm pod start` span and an observation."""
        for name, (pool, born) in list(self._starting.items()):
            pod = self.cache.pods.get(name)
            if pod is not None and not _ready(pod) and not ended(pod):
                continue
            del self._starting[name]
            if pod is not None and _ready(pod):
                now = time.time_ns()
                self._metrics.pool_pod_start.labels(pool.label).observe((now - born) / 1e9)
                tracer.start_span("warm pod start", start_time=born, attributes={"k8s.pod.name": name}).end(now)

    async def _maintain(self, pool: PoolClass) -> None:
        self._note_started()
        mine = self._idle(pool)
        now = now_utc()
        keep = []
        holding_back = self.holding_back()
        for pod in mine:
            if holding_back or ended(pod) or _too_old(pod, settings=self._settings, now=now):
                await self._delete(pod)
            else:
                keep.append(pod)
        self._hold_sessions(keep)
        ready = [pod for pod in self._idle(pool) if _ready(pod)]
        self._metrics.pool_idle.labels(pool.label).set(len(ready))
        missing = 0 if holding_back else pool.size - len(keep)
        made = await asyncio.gather(*(self._create(pool, now) for _ in range(missing)), return_exceptions=True)
        if failed := next((error for error in made if isinstance(error, BaseException)), None):
            raise failed

    def holding_back(self) -> bool:
        """Whether the pool makes no pod now: it gave its pods back less than GIVE_BACK_SECONDS ago."""
        given = self._given_back_at
        return given is not None and asyncio.get_running_loop().time() - given < GIVE_BACK_SECONDS

    async def give_back(self) -> int:
        """Delete this manager's idle pods, and keep none for GIVE_BACK_SECONDS (one whose create was on its way is
        deleted once seen): the node has no room for a pod that matters more (the isolation canary, a job's own
        pod); returns how many were deleted now.

        Only idle ones, each on the resourceVersion seen, so a pod claimed meanwhile is kept for its job.
        """
        self._given_back_at = asyncio.get_running_loop().time()
        self.cache.notify()
        given = 0
        for pool in self.classes:
            for pod in self._idle(pool):
                try:
                    given += await self._delete(pod)
                except (ApiError, OSError) as exc:
                    log.warning("could not give back warm pod %s: %s", pod["metadata"]["name"], exc)
        return given

    async def _create(self, pool: PoolClass, now: datetime) -> None:
        """One idle pod more; the missing ones are made all at once, so a burst's replacements start together."""
        born = time.time_ns()
        body = pool_pod(pool=pool, owner=self.owner, settings=self._settings, now=now)
        created = await self._kube.create(PODS, namespace=self._namespace, body=body)
        self._starting[created["metadata"]["name"]] = (pool, born)
        self.cache.remember(created)

    async def _delete(self, pod: K8sObject) -> bool:
        """Delete an idle pod of ours, unless it changed (say, claimed) since we looked; True when deleted."""
        metadata = pod["metadata"]
        try:
            await self._kube.delete(PODS, namespace=self._namespace, name=metadata["name"], grace_period_seconds=0,
                                    preconditions_resource_version=metadata["resourceVersion"])
        except (Conflict, NotFound):
            return False
        return True

    async def release(self) -> None:
        """At shutdown (the jobs are done, their pods deleted): close the held sessions, drop the marks still on their
        way, and delete this manager's idle pods (nobody renews them any more)."""
        for task in self._holders | self._marking:
            task.cancel()
        if self._holders or self._marking:
            await asyncio.wait(self._holders | self._marking)
        for pool in self.classes:
            for pod in self._idle(pool):
                try:
                    await self._delete(pod)
                except (ApiError, OSError) as exc:  # the sweeper will get them
                    log.warning("could not delete warm pod %s: %s", pod["metadata"]["name"], exc)


def _ready(pod: K8sObject) -> bool:
    """Its runner is up: the container is running (attach needs that) and the pod is not ending."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any((s.get("state") or {}).get("running") for s in status.get("containerStatuses") or [])


def _scheduled(pod: K8sObject) -> bool:
    """On a node: it will start there (an unscheduled one may wait for room indefinitely)."""
    return bool((pod.get("spec") or {}).get("nodeName"))


def _too_old(pod: K8sObject, *, settings: ScriptsManagerSettings, now: datetime) -> bool:
    """Too old to fit the longest script allowed: replace it before a request finds it useless."""
    started = (pod.get("status") or {}).get("startTime")
    if not started:
        return False
    age = (now - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()
    left = settings.scripts_pool_pod_lifetime_seconds - age
    return left < settings.scripts_max_timeout_seconds + DEADLINE_SLACK_SECONDS + 60
