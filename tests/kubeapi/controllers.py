"""A stand-in for kube-controller-manager's deployment controller, talking HTTP like any other client.

No pods run in the emulator, so this controller reports every Deployment's replicas as ready
and available at once: enough for an operator to see its Deployments become Ready, with the
`observedGeneration` bookkeeping a real controller does.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from rockbot.kube import DEPLOYMENTS, Conflict, Gone, KubeClient, NotFound
from tests.kubeapi.clock import now


class DeploymentController:
    """Watches all Deployments and writes their `/status` as if every replica came up."""

    def __init__(self, *, client: KubeClient) -> None:
        self._client = client

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion; relist after a 410, resume when a stream ends."""
        while True:
            listed = await self._client.list(DEPLOYMENTS)
            for deployment in listed.items:
                await self._reconcile(deployment)
            version = listed.resource_version
            with contextlib.suppress(Gone):
                while True:
                    async for event in self._client.watch(DEPLOYMENTS, resource_version=version, timeout_seconds=60):
                        version = event.object["metadata"]["resourceVersion"]
                        if event.type in ("ADDED", "MODIFIED"):
                            await self._reconcile(event.object)

    async def _reconcile(self, deployment: dict[str, Any]) -> None:
        meta = deployment["metadata"]
        if meta.get("deletionTimestamp"):
            return
        status = deployment.get("status") or {}
        desired = ready_status(deployment)
        if _comparable(status) == _comparable(desired):
            return
        old_times = {c["type"]: c.get("lastTransitionTime") for c in status.get("conditions") or []}
        for condition in desired["conditions"]:
            condition["lastTransitionTime"] = old_times.get(condition["type"]) or condition["lastTransitionTime"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": desired}
        with contextlib.suppress(NotFound, Conflict):  # gone, or changed: the next event brings it back
            await self._client.patch(DEPLOYMENTS, namespace=meta["namespace"], name=meta["name"],
                                     subresource="status", body=body)


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


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    conditions = [
        {key: value for key, value in c.items() if key not in ("lastTransitionTime", "lastUpdateTime")}
        for c in status.get("conditions") or []
    ]
    return {**status, "conditions": conditions}


@contextlib.asynccontextmanager
async def running(controller: DeploymentController) -> AsyncIterator[asyncio.Task[None]]:
    """Run a controller in the background for the duration of the block."""
    task = asyncio.create_task(controller.run(), name="deployment-controller")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
