"""The Kubernetes backend: every script runs in a pod of its own, used once and deleted (a session's calls, in
the conversation's own pod: pod_sessions.py).

Warm path: when the job's limits match a class of the warm pool (pool.py), claim an idle pod of that
class, write the job on the attach session the pool opened to it while it was idle (or attach now, if it
has none), read the answer from the attach stream. Cold path (no pool, another class, or no idle pod):
create a pod for the job, attach as soon as its container runs, then the same. Either way the answer is
the runner's result line, taken from the stream as soon as it is printed (pod_jobs.py), not from the
kubelet's report that the container ended, which comes on its status relist; the pod is deleted on every
path, in a task of its own that the answer does not wait for (and that a cancelled request cannot stop;
`close` waits for them all).

A claimed pod that fails before its runner said the script started (it died, was evicted, or the
attach was refused) is deleted and the job goes to another pod or the cold path: the script has not
run. Once it started, a failure is the job's answer: a script never runs twice. When the stream
ends without a result, the pod's end state (OOM kill, deadline) and its log, read with a byte
limit, give the answer.

Each job's steps are spans under the manager's `run script`: `start-up` (claiming a warm pod, or
creating one), `run` (waiting for a cold pod's container to run, attach, job, answer) and `cleanup`
(the delete), with the pod's name; events mark the steps within them (`claimed`, `pod created`,
`pod scheduled`, `pod container running`, `attach refused`, and pod_jobs.py's), so a trace shows
where a slow answer's time went (benchmarks/bench_pods.py prints them as a phase breakdown).

Each instance holds a Lease and marks every pod it makes or claims with its id and a job's pod with who
waits for the answer; when an instance dies, whoever is alive deletes its pods at once and answers their
jobs (reaping.py). A redelivered request whose script a pod already took is not run again
(`taken_before`). The kubelet stops every pod at its activeDeadlineSeconds in any case.

A cold pod (a job's, or the isolation canary's) the scheduler finds no room for (`Unschedulable`, say
`Insufficient cpu`) makes this manager give back its own idle warm pods at once (`WarmPool.give_back`: deleted,
and none made for a minute), so that the pod that has a job can run in their place.

A 401 from the API server at any step is no job's failure: this process's token was revoked (its pod was
force-deleted, and the process lives on until the kubelet stops it). It is `CredentialsRevoked`, never an
answer: a job whose pod could not be made (nothing of it started) goes back to the queue for a live manager;
one whose pod was made gets the retryable "the scripts-manager running this script stopped" answer (service.py).

A cold pod that cannot start (its image cannot be pulled, its container not made, or it is not running
within ROCKBOT_SCRIPTS_POD_START_SECONDS) gets a Warning Event, reason `ScriptPodFailedToStart`, before
it is deleted: `kubectl -n <scripts namespace> get events --field-selector reason=ScriptPodFailedToStart`.

RBAC: a namespaced Role in the scripts namespace with exactly
    pods:           create, get, list, watch, patch, delete
    pods/attach:    get, create
    pods/log:       get
    events:         create
    leases:         create, get, list, update, delete
(`get` on pods is the re-read after a watch answers 410 Gone; `list` the reaper and the pool's
cache; `patch` the claim; `pods/attach` is a GET upgraded to a WebSocket, which Kubernetes 1.35 and
later also authorise as `create`; leases: each instance's own, and the others' it judges.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import aiohttp
from opentelemetry import trace

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.kube import PODS, ApiError, Gone, KubeClient, NotFound, Unauthorized
from rockbot.kube.events import EventPoster
from rockbot.scripts_manager.backends import (
    CredentialsRevoked,
    SandboxFailure,
    SandboxUnavailable,
    ScriptJob,
    Taken,
    outputs,
)
from rockbot.scripts_manager.backends.pod_jobs import (
    OutputTooLarge,
    RunnerOutput,
    new_nonce,
    output_limit,
    run_job,
)
from rockbot.scripts_manager.backends.pod_manifests import (
    CONTAINER,
    DEADLINE_SLACK_SECONDS,
    REQUEST_LABEL,
    job_pod,
    now_utc,
    request_key,
)
from rockbot.scripts_manager.backends.pod_sessions import PodSessions
from rockbot.scripts_manager.backends.pool import GIVE_BACK_SECONDS, WarmPool
from rockbot.scripts_manager.backends.reaping import Reaper
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.tasks import cancel_and_wait
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

K8sObject = dict[str, Any]

#: Waiting reasons after which the container will not start by itself.
_CANNOT_START = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError"}
#: The reason of the Warning Event on a script pod that could not start (image pull, config, capacity).
CANNOT_START = "ScriptPodFailedToStart"
_WATCH_SECONDS = 60
_WATCH_RETRY_SECONDS = 1.0
#: How often a job tries to attach to a pod that may have just started running.
_ATTACH_RETRY_SECONDS = 0.1
#: Tries to delete a used pod while the API fails (1 s, then 2 s apart) before leaving it to the sweep.
_DELETE_TRIES = 3
_DELETE_RETRY_SECONDS = 1.0


class _NeverStarted(Exception):
    """A claimed warm pod failed before its runner started the script: the job may go elsewhere."""


class PodBackend:
    name = "pods"

    def __init__(
        self, *, kube: KubeClient, settings: ScriptsManagerSettings, metrics: ScriptMetrics,
        on_revoked: Callable[[CredentialsRevoked], None] | None = None,
    ) -> None:
        """`on_revoked`: told when the Lease's renewal meets a 401 (a job that meets one raises it instead)."""
        self._kube = kube
        self._settings = settings
        self.metrics = metrics
        self._namespace = settings.scripts_namespace
        self._post_event = EventPoster(kube, component="rockbot-scripts-manager")
        self._tasks: list[asyncio.Task[None]] = []
        self._deleting: set[asyncio.Task[None]] = set()  # used pods' deletes, which no answer waits for
        self.reaper = Reaper(kube=kube, settings=settings, metrics=metrics, on_revoked=on_revoked)
        self.orphans = self.reaper.orphans
        # A pod's start (scheduling, image pull), then the slack of its attach, its end and its answer.
        self.start_seconds = settings.scripts_pod_start_seconds + 3 * DEADLINE_SLACK_SECONDS
        pooled = any(pool.size > 0 for pool in settings.scripts_pool)
        self.pool = WarmPool(kube=kube, settings=settings, metrics=metrics, owner=self.reaper.instance,
                             ready=self.reaper.held) if pooled else None
        self.sessions = PodSessions(backend=self, settings=settings)

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.reaper.run(), name="hold the Lease, reap dead instances"))
        if self.pool is not None:
            self._tasks.append(asyncio.create_task(self.pool.cache.run(), name="watch the warm pool"))
            self._tasks.append(asyncio.create_task(self.pool.run(), name="keep the warm pool"))

    async def close(self) -> None:
        await self.sessions.close()
        await cancel_and_wait(*self._tasks)
        if self._deleting:
            await asyncio.wait(self._deleting)
        if self.pool is not None:
            await self.pool.release()
        await self.reaper.release()
        await self._kube.close()

    async def taken_before(self, *, user: str, request_id: str) -> Taken | None:
        """What became of a redelivered request: a pod runs (or ran) it, or its pod was reaped; None when no pod
        ever took it, so that its script has not started anywhere."""
        if self.reaper.reaped(user=user, request_id=request_id) is not None:
            return Taken.REAPED
        key = request_key(user=user, request_id=request_id)
        try:
            listed = await self._kube.list(PODS, namespace=self._namespace, label_selector=f"{REQUEST_LABEL}={key}")
        except Unauthorized as exc:
            raise _revoked(exc, may_have_run=False) from exc
        except (ApiError, aiohttp.ClientError, OSError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API did not answer: {exc}") from exc
        return Taken.RUNNING if listed.items else None

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse:
        try:
            return await self._run(job)
        except Unauthorized as exc:  # past the pod's create (see `_create`): the job may have started
            raise _revoked(exc, may_have_run=True) from exc

    async def _run(self, job: ScriptJob) -> ScriptInvokeResponse:
        started = time.monotonic()
        await self._held()
        if job.session is not None:
            return await self.sessions.run(job)
        if self.pool is not None:
            async with contextlib.aclosing(self.pool.claims(job)) as claims:
                while (name := await _claimed(claims)) is not None:
                    try:
                        return await self._run_on(name=name, job=job, path="warm", since=started,
                                                  started=self._warm_started(name))
                    except _NeverStarted as exc:
                        log.info("warm pod %s failed before the script started (%s); trying another", name, exc)
                        pool = self.pool.class_of(job)
                        self.metrics.pool_misses.labels(pool.label if pool else "", "failed").inc()
        return await self._cold(job, since=started)

    async def _held(self) -> None:
        """Wait (bounded like a pod start) until this instance holds its Lease: a pod marked with its id before
        would look like a dead instance's to the others."""
        reaper = self.reaper
        if not reaper.held.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.scripts_pod_start_seconds):
                    await reaper.tried.wait()
        if not reaper.held.is_set():
            raise SandboxUnavailable(
                f"this scripts-manager cannot take its Lease in the scripts namespace {self._namespace!r} "
                f"({reaper.problem or 'no answer yet'}), and makes no script pod without one: does the namespace "
                "exist, and may it create, get and update leases there?"
            )

    async def _cold(self, job: ScriptJob, *, since: float) -> ScriptInvokeResponse:
        pod = job_pod(job=job, settings=self._settings, now=now_utc(), manager=self.reaper.instance)
        name = pod["metadata"]["name"]
        created = None
        self.reaper.in_use.add(name)
        try:
            with tracer.start_as_current_span("start-up", attributes={"rockbot.script.path": "cold",
                                                                      "k8s.pod.name": name}):
                created = await self._create(pod)
                trace.get_current_span().add_event("pod created")
            return await self._run_on(name=name, job=job, path="cold", since=since,
                                      started=asyncio.create_task(self._started(created)))
        except Unauthorized:
            raise
        except ApiError as exc:
            if _transient(exc):
                raise SandboxUnavailable(f"the Kubernetes API is overloaded or failing ({exc}); try again") from exc
            raise SandboxFailure(f"the Kubernetes API refused a step of the script pod {name}: {exc}") from exc
        except OSError as exc:
            raise SandboxUnavailable(f"the Kubernetes API became unreachable: {exc}") from exc
        finally:
            if created is not None:
                self._delete_soon(name)
            else:
                self.reaper.in_use.discard(name)

    async def _started(self, pod: K8sObject) -> K8sObject:
        """The pod once its container runs (or it ended); one that cannot start is a Warning Event on it."""
        limit = self._settings.scripts_pod_start_seconds + DEADLINE_SLACK_SECONDS
        try:
            return await self._follow(name=pod["metadata"]["name"], resource_version=pod["metadata"]["resourceVersion"],
                                      until=_running_or_finished, limit=limit, no_room=self._no_room)
        except (SandboxFailure, SandboxUnavailable) as exc:
            await self._post_event({"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}, "Warning",
                                   CANNOT_START, f"the script pod could not start: {exc}")
            raise

    async def _no_room(self, pod: K8sObject, why: str) -> None:
        """The scheduler has no room for this job's pod: give back this manager's idle warm pods so that it fits."""
        if self.pool is None:
            return
        given = await self.pool.give_back()
        log.warning("the script pod %s cannot be scheduled (%s): gave back %d idle warm pods of this manager's, and "
                    "the pool makes none for %g s", pod["metadata"]["name"], why, given, GIVE_BACK_SECONDS)

    async def _create(self, pod: K8sObject) -> K8sObject:
        try:
            return await self._kube.create(PODS, namespace=self._namespace, body=pod)
        except Unauthorized as exc:  # no pod, so nothing of the job started: it may go to a live manager
            raise _revoked(exc, may_have_run=False) from exc
        except ApiError as exc:
            raise SandboxUnavailable(f"cannot create the script pod in {self._namespace!r}: {exc}") from exc
        except OSError as exc:
            raise SandboxUnavailable(f"the Kubernetes API is unreachable: {exc}") from exc

    async def _run_on(
        self, *, name: str, job: ScriptJob, path: str, since: float, started: asyncio.Task[K8sObject | None]
    ) -> ScriptInvokeResponse:
        """Run the job on a pod of ours that runs or is starting (`started` ends once it runs or ended), and
        delete the pod after (a warm one here, a cold one by the caller).

        The kubelet accepts an attach as soon as the container runs, up to a second before its status says
        so (its 1 s relist), so the attach is tried at once and again every _ATTACH_RETRY_SECONDS until
        `started` ends; a refused attach has written nothing, so the job is never given twice.
        """
        self.reaper.in_use.add(name)
        try:
            with tracer.start_as_current_span("run", attributes={"rockbot.script.path": path, "k8s.pod.name": name}):
                while not started.done():
                    try:
                        return await self._run_job(name=name, job=job, path=path, since=since, early=True)
                    except _NeverStarted:
                        trace.get_current_span().add_event("attach refused")
                        await asyncio.wait([started], timeout=_ATTACH_RETRY_SECONDS)
                pod = started.result()
                if pod is None or _finished(pod) or pod["metadata"].get("deletionTimestamp"):
                    if path == "warm":
                        raise _NeverStarted("it ended, or went, before its runner started")
                    assert pod is not None  # a cold pod's watch raises when the pod goes
                    return await self._answer_from_end(job=job, pod=pod, output=None)  # it ended first: say why
                return await self._run_job(name=name, job=job, path=path, since=since)
        finally:
            if not started.done():
                started.cancel()
            with contextlib.suppress(asyncio.CancelledError, SandboxFailure, SandboxUnavailable, ApiError, OSError):
                await started
            if path == "warm":
                self._delete_soon(name)

    def _warm_started(self, name: str) -> asyncio.Task[K8sObject | None]:
        """The claimed warm pod once it runs or ended, as the pool's watch shows it (bounded like a cold start)."""
        assert self.pool is not None

        async def started() -> K8sObject | None:
            try:
                async with asyncio.timeout(self._settings.scripts_pod_start_seconds):
                    return await self.pool.started(name)
            except TimeoutError:
                return None

        return asyncio.create_task(started())

    async def _run_job(
        self, *, name: str, job: ScriptJob, path: str, since: float, early: bool = False
    ) -> ScriptInvokeResponse:
        """One attach and job. `early`: the pod may not run yet, so any refusal before the runner started the
        script is `_NeverStarted` (the rig's kubelet answers 500 for a container not running yet)."""
        warm = path == "warm"

        def started() -> None:
            self.metrics.first_instruction.labels(path).observe(time.monotonic() - since)

        nonce = new_nonce()
        held = None
        try:
            try:
                async with asyncio.timeout(job.timeout_seconds + 2 * DEADLINE_SLACK_SECONDS):
                    if warm and self.pool is not None:
                        held = await self.pool.take(name)  # the session the pool opened while the pod was idle
                    attempt = await run_job(
                        kube=self._kube, namespace=self._namespace, name=name, job=job, nonce=nonce,
                        max_output_bytes=self._settings.scripts_max_output_bytes, on_started=started,
                        session=held.session if held is not None else None,
                    )  # fmt: skip
            except TimeoutError:
                raise SandboxFailure(f"the script pod {name} gave no answer within "
                                     f"{job.timeout_seconds + 2 * DEADLINE_SLACK_SECONDS:g} s") from None
            except OutputTooLarge as exc:
                raise SandboxFailure(f"the script pod {name} broke its runner's protocol: {exc}") from None
            except Unauthorized:
                raise
            except ApiError as exc:
                if early or (warm and not _transient(exc)):
                    raise _NeverStarted(f"attach refused: {exc}") from exc
                raise
            output = attempt.output
            if output.result is not None:
                answer = _response(job=job, result=output.result, pod=name)
            else:
                if (warm or early) and not output.started and not await self._log_says_started(name, nonce, job):
                    raise _NeverStarted(f"the attach session ended: {(attempt.status or {}).get('message')}")
                final = await self._follow(name=name, resource_version=None, until=_finished,
                                           limit=job.timeout_seconds + 2 * DEADLINE_SLACK_SECONDS)
                answer = await self._answer_from_end(job=job, pod=final, output=output)
            self.metrics.pod_duration.labels(path).observe(time.monotonic() - since)
            return answer
        except Unauthorized:
            raise
        except ApiError as exc:
            if _transient(exc):
                raise SandboxUnavailable(f"the Kubernetes API is overloaded or failing ({exc}); try again") from exc
            raise SandboxFailure(f"the Kubernetes API refused a step of the script pod {name}: {exc}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API became unreachable: {exc}") from exc
        finally:
            if held is not None:
                held.released.set()

    async def _log_says_started(self, name: str, nonce: str, job: ScriptJob) -> bool:
        """Whether the runner got this job after all (its log keeps what the broken stream lost)."""
        output = RunnerOutput(nonce=nonce, limit=self._output_limit(job))
        try:
            output.feed((await self._read_log(name, job)).encode())
        except Unauthorized:
            raise
        except (ApiError, OutputTooLarge):
            return False
        output.finish()
        return output.started

    async def _read_log(self, name: str, job: ScriptJob) -> str:
        """The pod's log, never more than a runner writes plus one byte (so more is seen, not read)."""
        return await self._kube.read_log(
            namespace=self._namespace, name=name, container=CONTAINER, limit_bytes=self._output_limit(job) + 1,
        )  # fmt: skip

    def _output_limit(self, job: ScriptJob) -> int:
        return output_limit(self._settings.scripts_max_output_bytes, job.output_bounds)

    async def _follow(
        self, *, name: str, resource_version: str | None, until: Callable[[K8sObject], bool], limit: float,
        no_room: Callable[[K8sObject, str], Awaitable[None]] | None = None,
    ) -> K8sObject:
        """Watch the pod (from `resource_version`, or its current state) until `until` holds; never poll. `no_room`
        is awaited the first time the pod is seen unschedulable."""
        last: K8sObject | None = None
        noted: set[str] = set()
        try:
            async with asyncio.timeout(limit):
                while True:
                    try:
                        async for event in self._kube.watch(
                            PODS, namespace=self._namespace, field_selector=f"metadata.name={name}",
                            resource_version=resource_version, timeout_seconds=_WATCH_SECONDS,
                        ):  # fmt: skip
                            if event.type == "DELETED":
                                raise SandboxFailure(f"the script pod {name} was deleted while running")
                            last = event.object
                            resource_version = last["metadata"]["resourceVersion"]
                            _note_progress(last, noted)
                            if until(last):
                                return last
                            if no_room is not None and "unschedulable" not in noted and (why := _unschedulable(last)):
                                noted.add("unschedulable")
                                await no_room(last, why)
                            _check_startable(last)
                    except Gone:
                        last = await self._kube.get(PODS, namespace=self._namespace, name=name)
                        resource_version = last["metadata"]["resourceVersion"]
                        if until(last):
                            return last
                    except (aiohttp.ClientError, OSError) as exc:  # a dropped stream: resume where it was
                        log.info("watch of %s broke (%r); resuming", name, exc)
                        await asyncio.sleep(_WATCH_RETRY_SECONDS)
        except TimeoutError:
            waiting = _waiting_reason(last) if last else None
            raise SandboxUnavailable(
                f"the script pod {name} did not get there within {limit:g} s"
                + (f" (container waiting: {waiting})" if waiting else "")
                + "; the cluster may be short of capacity"
            ) from None

    async def _answer_from_end(
        self, *, job: ScriptJob, pod: K8sObject, output: RunnerOutput | None
    ) -> ScriptInvokeResponse:
        """The answer when the stream gave none: from the pod's end state, and its log if that has the result."""
        name = pod["metadata"]["name"]
        terminated = _terminated(pod) or {}
        reason = terminated.get("reason") or (pod.get("status") or {}).get("reason")
        oom = reason == "OOMKilled"
        deadline = (pod.get("status") or {}).get("reason") == "DeadlineExceeded"
        result = None
        if output is not None:
            from_log = RunnerOutput(nonce=output.nonce, limit=output.limit)
            try:
                from_log.feed((await self._read_log(name, job)).encode())
                from_log.finish()
                result = from_log.result
            except ApiError as exc:
                if _transient(exc) or isinstance(exc, Unauthorized):
                    raise
                log.warning("could not read the log of %s: %s", name, exc)
            except OutputTooLarge as exc:
                raise SandboxFailure(f"the script pod {name} broke its runner's protocol: {exc}") from None
        if result is not None:
            return _response(job=job, result=result, oom=oom, pod=name)
        if deadline and not terminated.get("startedAt"):
            raise SandboxUnavailable(
                f"the script pod {name} reached its deadline before the script started "
                f"(scheduling or the image pull took too long; waiting: {_waiting_reason(pod) or 'unknown'}); "
                "the cluster may be short of capacity, or raise ROCKBOT_SCRIPTS_POD_START_SECONDS"
            )
        if not (oom or deadline):
            raise SandboxFailure(
                f"the script pod ended without a result (reason {reason}, exit code {terminated.get('exitCode')})"
            )
        return ScriptInvokeResponse(
            request_id=job.request_id, stdout="", stderr="", timed_out=deadline, oom_killed=oom,
            exit_code=None if deadline else terminated.get("exitCode"), duration_seconds=_ran_for(terminated),
            backend=self.name, pod=name,
        )  # fmt: skip

    def _delete_soon(self, name: str) -> None:
        """Delete a used pod without holding the answer for it (the close waits for every delete)."""
        task = asyncio.create_task(self._delete(name), name=f"delete script pod {name}")
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)

    async def _delete(self, name: str) -> None:
        """Delete a used pod at once (no grace), trying again a few times when the API fails; after that, or on a
        refusal, the sweep deletes it (an ended pod at its next round, see reaping.py)."""
        with tracer.start_as_current_span("cleanup", attributes={"k8s.pod.name": name}):
            try:
                for attempt in range(_DELETE_TRIES):
                    try:
                        await self._kube.delete(PODS, namespace=self._namespace, name=name, grace_period_seconds=0)
                        return
                    except NotFound:
                        return
                    except (ApiError, aiohttp.ClientError, OSError) as exc:
                        if attempt + 1 == _DELETE_TRIES or (isinstance(exc, ApiError) and not _transient(exc)):
                            log.warning("could not delete script pod %s (%s); the sweep will", name, exc)
                            return
                    await asyncio.sleep(_DELETE_RETRY_SECONDS * 2**attempt)
            finally:
                self.reaper.in_use.discard(name)

    # What the session pods (pod_sessions.py) use of this backend.
    @property
    def kube(self) -> KubeClient:
        return self._kube

    async def create_pod(self, pod: K8sObject) -> K8sObject:
        return await self._create(pod)

    async def started(self, pod: K8sObject) -> K8sObject:
        return await self._started(pod)

    async def warm_started(self, name: str) -> K8sObject | None:
        return await self._warm_started(name)

    def delete_soon(self, name: str) -> None:
        self._delete_soon(name)

    async def follow_to_end(self, name: str, *, limit: float) -> K8sObject:
        return await self._follow(name=name, resource_version=None, until=_finished, limit=limit)

    async def sweep(self, *, now: datetime | None = None) -> int:
        """Clean up after dead instances and delete pods past their deadline now (reaping.py); returns how many."""
        return await self.reaper.sweep(now=now)


async def _claimed(claims: AsyncIterator[str]) -> str | None:
    """The next warm pod claimed for the job (None: none left); a claim is the job's start-up span."""
    started = time.time_ns()
    name = await anext(claims, None)
    if name is not None:
        trace.get_current_span().add_event("claimed")
        tracer.start_span("start-up", start_time=started,
                          attributes={"rockbot.script.path": "warm", "k8s.pod.name": name}).end()
    return name


def _response(*, job: ScriptJob, result: dict[str, Any], pod: str, oom: bool = False) -> ScriptInvokeResponse:
    """The runner's result as the answer, naming the pod it ran in, with the files it read from /output."""
    try:
        collected = outputs.received(result.get("artifacts", []), result.get("artifacts_dropped", []),
                                     bounds=job.output_bounds)
    except ValueError as exc:
        raise SandboxFailure(f"the script pod {pod} broke its runner's protocol: {exc}") from None
    return ScriptInvokeResponse(
        request_id=job.request_id,
        stdout=result["stdout"],
        stderr=result["stderr"],
        exit_code=result["exit_code"],
        timed_out=bool(result["timed_out"]),
        oom_killed=bool(result["oom_killed"]) or oom,
        output_truncated=bool(result["output_truncated"]),
        duration_seconds=float(result["duration_seconds"]),
        backend=PodBackend.name,
        pod=pod,
        artifacts=collected.artifacts,
        artifacts_dropped=collected.dropped,
    )


def _revoked(exc: Unauthorized, *, may_have_run: bool) -> CredentialsRevoked:
    return CredentialsRevoked(f"the Kubernetes API no longer accepts this scripts-manager's credentials ({exc}): "
                              "its pod or ServiceAccount was deleted", may_have_run=may_have_run)


def _transient(exc: ApiError) -> bool:
    """Throttled (429) or a server error (5xx): the same request may well work a moment later."""
    return exc.status == 429 or exc.status >= 500


def _container_status(pod: K8sObject) -> K8sObject:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status
    return {}


def _terminated(pod: K8sObject) -> K8sObject | None:
    return (_container_status(pod).get("state") or {}).get("terminated")


def _waiting_reason(pod: K8sObject) -> str | None:
    return ((_container_status(pod).get("state") or {}).get("waiting") or {}).get("reason")


def _finished(pod: K8sObject) -> bool:
    """The container has terminated (about a second before the phase says so), or the pod has ended."""
    return _terminated(pod) is not None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _running_or_finished(pod: K8sObject) -> bool:
    return bool((_container_status(pod).get("state") or {}).get("running")) or _finished(pod)


def _note_progress(pod: K8sObject, noted: set[str]) -> None:
    """An event on the current span for each step of a pod's start the watch shows first."""
    steps = (("pod scheduled", bool((pod.get("spec") or {}).get("nodeName"))),
             ("pod container running", _running_or_finished(pod)))
    for step, reached in steps:
        if reached and step not in noted:
            noted.add(step)
            trace.get_current_span().add_event(step)


def _unschedulable(pod: K8sObject) -> str | None:
    """The scheduler's word when it found no node with room for the pod (`0/1 nodes are available: 1 Insufficient
    cpu.`), else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return condition.get("message") or "Unschedulable"
    return None


def _check_startable(pod: K8sObject) -> None:
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in _CANNOT_START:
        raise SandboxFailure(
            f"the script container cannot start: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        )


def _ran_for(terminated: K8sObject) -> float:
    try:
        started = datetime.fromisoformat(terminated["startedAt"].replace("Z", "+00:00"))
        finished = datetime.fromisoformat(terminated["finishedAt"].replace("Z", "+00:00"))
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0.0
    return max((finished - started).total_seconds(), 0.0)

