"""The Kubernetes backend: one throw-away pod per script in the scripts namespace.

Per run: create the pod (its ConfigMap volume does not exist yet, so it waits in
ContainerCreating), create the ConfigMap owned by the pod, follow the pod with a watch on its
name until the container terminates, read the runner's one JSON line from the log, delete the
pod (the ConfigMap goes with it, and is deleted explicitly too). Cleanup runs on every path,
shielded from cancellation. A sweeper (on start and every ROCKBOT_SCRIPTS_SWEEP_INTERVAL_SECONDS)
deletes script pods and ConfigMaps past their deadline annotation plus a grace, so a crashed
manager leaks nothing for long.

RBAC: a namespaced Role in the scripts namespace with exactly
    pods:           create, get, list, watch, delete
    pods/log:       get
    configmaps:     create, list, delete
(`get` on pods is the re-read after a watch answers 410 Gone; `list` on both is the sweeper.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import datetime
from typing import Any

import aiohttp

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.kube import CONFIGMAPS, PODS, ApiError, Gone, KubeClient, NotFound
from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable, ScriptJob
from rockbot.scripts_manager.backends.pod_manifests import (
    CONTAINER,
    DEADLINE_ANNOTATION,
    DEADLINE_SLACK_SECONDS,
    SANDBOX_SELECTOR,
    build_config_map,
    build_pod,
    now_utc,
    pod_name,
)
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.runner import RESULT_KEY
from rockbot.scripts_manager.settings import ScriptsManagerSettings

log = logging.getLogger(__name__)

K8sObject = dict[str, Any]

#: Waiting reasons after which the container will not start by itself.
_CANNOT_START = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "RunContainerError"}
_WATCH_SECONDS = 60
_WATCH_RETRY_SECONDS = 1.0


class PodBackend:
    name = "pods"

    def __init__(self, *, kube: KubeClient, settings: ScriptsManagerSettings, metrics: ScriptMetrics) -> None:
        self._kube = kube
        self._settings = settings
        self._metrics = metrics
        self._namespace = settings.scripts_namespace
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="sweep script pods")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self._kube.close()

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse:
        name = pod_name(job)
        pod = build_pod(job=job, name=name, settings=self._settings, now=now_utc())
        try:
            created = await self._kube.create(PODS, namespace=self._namespace, body=pod)
        except ApiError as exc:
            raise SandboxUnavailable(f"cannot create the script pod in {self._namespace!r}: {exc}") from exc
        except OSError as exc:
            raise SandboxUnavailable(f"the Kubernetes API is unreachable: {exc}") from exc
        try:
            await self._kube.create(
                CONFIGMAPS, namespace=self._namespace,
                body=build_config_map(job=job, pod=created, settings=self._settings),
            )  # fmt: skip
            final = await self._follow(name=name, resource_version=created["metadata"]["resourceVersion"], job=job)
            return await self._result(job=job, pod=final)
        except ApiError as exc:
            if _transient(exc):
                raise SandboxUnavailable(f"the Kubernetes API is overloaded or failing ({exc}); try again") from exc
            raise SandboxFailure(f"the Kubernetes API refused a step of the script pod {name}: {exc}") from exc
        except OSError as exc:
            raise SandboxUnavailable(f"the Kubernetes API became unreachable: {exc}") from exc
        finally:
            await asyncio.shield(self._delete(name))

    async def _follow(self, *, name: str, resource_version: str, job: ScriptJob) -> K8sObject:
        """Watch the pod until its container has terminated (or the pod ended); never poll."""
        limit = self._settings.scripts_pod_start_seconds + job.timeout_seconds + 2 * DEADLINE_SLACK_SECONDS
        last: K8sObject | None = None
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
                            if _finished(last):
                                return last
                            _check_startable(last)
                    except Gone:
                        last = await self._kube.get(PODS, namespace=self._namespace, name=name)
                        resource_version = last["metadata"]["resourceVersion"]
                        if _finished(last):
                            return last
                    except (aiohttp.ClientError, OSError) as exc:  # a dropped stream: resume where it was
                        log.info("watch of %s broke (%r); resuming", name, exc)
                        await asyncio.sleep(_WATCH_RETRY_SECONDS)
        except TimeoutError:
            waiting = _waiting_reason(last) if last else None
            raise SandboxUnavailable(
                f"the script pod {name} did not finish within {limit:g} s"
                + (f" (container waiting: {waiting})" if waiting else "")
                + "; the cluster may be short of capacity"
            ) from None

    async def _result(self, *, job: ScriptJob, pod: K8sObject) -> ScriptInvokeResponse:
        terminated = _terminated(pod) or {}
        reason = terminated.get("reason") or (pod.get("status") or {}).get("reason")
        oom = reason == "OOMKilled"
        deadline = (pod.get("status") or {}).get("reason") == "DeadlineExceeded"
        try:
            text = await self._kube.read_log(
                namespace=self._namespace, name=pod["metadata"]["name"], container=CONTAINER
            )
        except ApiError as exc:
            if _transient(exc):
                raise
            text = ""
            log.warning("could not read the log of %s: %s", pod["metadata"]["name"], exc)
        result = _runner_result(text)
        if result is None and deadline and not terminated.get("startedAt"):
            raise SandboxUnavailable(
                f"the script pod {pod['metadata']['name']} reached its deadline before the script started "
                f"(scheduling or the image pull took too long; waiting: {_waiting_reason(pod) or 'unknown'}); "
                "the cluster may be short of capacity, or raise ROCKBOT_SCRIPTS_POD_START_SECONDS"
            )
        if result is None:
            if not (oom or deadline):
                raise SandboxFailure(
                    f"the script pod ended without a result (reason {reason}, exit code {terminated.get('exitCode')})"
                )
            return ScriptInvokeResponse(
                request_id=job.request_id, stdout="", stderr="", timed_out=deadline, oom_killed=oom,
                exit_code=None if deadline else terminated.get("exitCode"), duration_seconds=_ran_for(terminated),
            )  # fmt: skip
        return ScriptInvokeResponse(
            request_id=job.request_id,
            stdout=result["stdout"],
            stderr=result["stderr"],
            exit_code=result["exit_code"],
            timed_out=bool(result["timed_out"]),
            oom_killed=bool(result["oom_killed"]) or oom,
            output_truncated=bool(result["output_truncated"]),
            duration_seconds=float(result["duration_seconds"]),
        )

    async def _delete(self, name: str) -> None:
        for resource in (PODS, CONFIGMAPS):
            try:
                await self._kube.delete(resource, namespace=self._namespace, name=name, grace_period_seconds=0)
            except NotFound:
                pass
            except (ApiError, OSError) as exc:  # the sweeper will get it
                log.warning("could not delete %s %s: %s", resource.kind, name, exc)

    async def sweep(self, *, now: datetime | None = None) -> int:
        """Delete script pods and ConfigMaps whose deadline plus the grace has passed; returns how many."""
        now = now or now_utc()
        grace = self._settings.scripts_sweep_grace_seconds
        deleted = 0
        for resource in (PODS, CONFIGMAPS):
            listed = await self._kube.list(resource, namespace=self._namespace, label_selector=SANDBOX_SELECTOR)
            for obj in listed.items:
                metadata = obj["metadata"]
                annotations = metadata.get("annotations") or {}
                stamp = annotations.get(DEADLINE_ANNOTATION) or metadata.get("creationTimestamp")
                try:
                    expired = (now - datetime.fromisoformat(stamp)).total_seconds() > grace
                except (TypeError, ValueError):
                    expired = True
                if not expired:
                    continue
                with contextlib.suppress(NotFound):
                    await self._kube.delete(resource, namespace=self._namespace, name=metadata["name"],
                                            grace_period_seconds=0)
                    deleted += 1
                    log.info("swept leftover %s %s", resource.kind, metadata["name"])
        self._metrics.swept.inc(deleted)
        return deleted

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except (ApiError, OSError) as exc:
                log.warning("sweeping script pods failed: %s", exc)
            await asyncio.sleep(self._settings.scripts_sweep_interval_seconds)


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


def _check_startable(pod: K8sObject) -> None:
    waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
    if waiting.get("reason") in _CANNOT_START:
        raise SandboxFailure(
            f"the script container cannot start: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
        )


def _runner_result(log_text: str) -> dict[str, Any] | None:
    for line in reversed(log_text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            return None
        return data if isinstance(data, dict) and data.get(RESULT_KEY) == 1 else None
    return None


def _ran_for(terminated: K8sObject) -> float:
    try:
        started = datetime.fromisoformat(terminated["startedAt"])
        finished = datetime.fromisoformat(terminated["finishedAt"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    return max((finished - started).total_seconds(), 0.0)
