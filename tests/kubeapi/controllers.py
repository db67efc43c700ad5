"""A stand-in for kube-controller-manager's deployment controller, talking HTTP like any other client.

No pods run in the emulator, so this controller reports every Deployment's replicas as ready and
available, with the `observedGeneration` bookkeeping a real controller does. By default at once;
with `kubelet_period` (a real kubelet relists containers every 1 s) it first reports the rollout
started (replicas updated, none ready) and only at the next kubelet tick the replicas ready, in two
status writes, as on a real node.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

from rockbot.kube import DEPLOYMENTS, Conflict, Gone, KubeClient, NotFound
from tests.kubeapi.clock import now

Key = tuple[str, str]


class DeploymentController:
    """Watches all Deployments and writes their `/status` as if every replica came up."""

    def __init__(self, *, client: KubeClient, kubelet_period: float = 0.0) -> None:
        self._client = client
        self._period = kubelet_period
        #: Deployments whose pods come up at the next kubelet tick: their latest known state.
        self._starting: dict[Key, dict[str, Any]] = {}

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion; relist after a 410, resume when a stream ends."""
        ticker = asyncio.create_task(self._tick_forever()) if self._period else None
        try:
            while True:
                listed = await self._client.list(DEPLOYMENTS)
                for deployment in listed.items:
                    await self._reconcile(deployment)
                version = listed.resource_version
                with contextlib.suppress(Gone):
                    while True:
                        async for event in self._client.watch(
                            DEPLOYMENTS, resource_version=version, timeout_seconds=60
                        ):
                            version = event.object["metadata"]["resourceVersion"]
                            if event.type in ("ADDED", "MODIFIED"):
                                await self._reconcile(event.object)
        finally:
            if ticker is not None:
                ticker.cancel()

    async def _reconcile(self, deployment: dict[str, Any]) -> None:
        meta = deployment["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self._starting:
            self._starting[key] = deployment
            return
        ready = ready_status(deployment)
        if _comparable(deployment.get("status") or {}) == _comparable(ready):
            return
        if self._period:
            self._starting[key] = deployment
            await self._write(deployment, rollout_status(deployment))
        else:
            await self._write(deployment, ready)

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._period - loop.time() % self._period)
            starting, self._starting = self._starting, {}
            for key, deployment in starting.items():
                if not await self._write(deployment, ready_status(deployment)):
                    self._starting.setdefault(key, deployment)  # changed meanwhile: its event brings the news

    async def _write(self, deployment: dict[str, Any], desired: dict[str, Any]) -> bool:
        """Write the status if the Deployment is still at the version seen; False if it changed meanwhile."""
        meta = deployment["metadata"]
        old = deployment.get("status") or {}
        old_times = {c["type"]: c.get("lastTransitionTime") for c in old.get("conditions") or []}
        for condition in desired["conditions"]:
            condition["lastTransitionTime"] = old_times.get(condition["type"]) or condition["lastTransitionTime"]
        status = {key: None for key in old if key not in desired} | desired  # the whole status, none of the old
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        try:
            await self._client.patch(DEPLOYMENTS, namespace=meta["namespace"], name=meta["name"],
                                     subresource="status", body=body)
        except NotFound:
            return True
        except Conflict:  # changed: the next event brings it back
            return False
        return True


def ready_status(deployment: dict[str, Any]) -> dict[str, Any]:
    """The status of a Deployment whose replicas are all up to date and available."""
    replicas = (deployment.get("spec") or {}).get("replicas", 1)
    timestamp = now()
    status: dict[str, Any] = {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability.", "lastTransitionTime": timestamp,
             "lastUpdateTime": timestamp},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "message": f'ReplicaSet "{deployment["metadata"]["name"]}" has successfully progressed.',
             "lastTransitionTime": timestamp, "lastUpdateTime": timestamp},
        ],
    }
    if replicas:  # like the real controller, zero counts are left out
        status.update(replicas=replicas, readyReplicas=replicas, availableReplicas=replicas, updatedReplicas=replicas)
    return status


def rollout_status(deployment: dict[str, Any]) -> dict[str, Any]:
    """The status right after the controller scaled the new ReplicaSet up: replicas updated, none ready yet."""
    replicas = (deployment.get("spec") or {}).get("replicas", 1)
    timestamp = now()
    status: dict[str, Any] = {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
             "message": "Deployment does not have minimum availability.", "lastTransitionTime": timestamp,
             "lastUpdateTime": timestamp},
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
             "message": f'ReplicaSet "{deployment["metadata"]["name"]}" is progressing.',
             "lastTransitionTime": timestamp, "lastUpdateTime": timestamp},
        ],
    }
    if replicas:
        status.update(replicas=replicas, updatedReplicas=replicas, unavailableReplicas=replicas)
    return status


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    conditions = [
        {key: value for key, value in c.items() if key not in ("lastTransitionTime", "lastUpdateTime")}
        for c in status.get("conditions") or []
    ]
    return {**status, "conditions": conditions}


class Worker(Protocol):
    async def run(self) -> None: ...


W = TypeVar("W", bound=Worker)


@contextlib.asynccontextmanager
async def in_background(worker: W) -> AsyncIterator[W]:
    """Run a controller (or the fake kubelet: anything with `run()`) in the background for the duration of the block."""
    task = asyncio.create_task(worker.run(), name=type(worker).__name__)
    try:
        yield worker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
