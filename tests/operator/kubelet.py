"""The kubelet's one report the operator waits on, without a node: each pod of a namespace is Ready.

The real controllers do the rest: the ReplicaSet counts the pod ready, the Deployment reports
`readyReplicas`, and the operator judges its Agent Ready from that. The operator's tests keep their
pods off any node (`NO_NODE_POLICY`: a scheduling gate added at admission), so a scheduler of the shared
rig never hands them to its real kubelet, which would report them failing to pull their image; unbound,
a deleted pod is gone at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator
from typing import Any

from rockbot.kube import PODS, Gone, KubeClient, NotFound

READY = ("Initialized", "ContainersReady", "Ready")
#: Namespaces with this label get pods no scheduler binds (a MutatingAdmissionPolicy adds a scheduling gate).
NO_NODE_LABEL = "rockbot.dev/no-node"
NO_NODE_POLICY = "rockbot-tests-no-node"


def no_node_policy() -> list[tuple[str, dict[str, Any]]]:
    """The policy and its binding (API path, manifest) that gate the scheduling of every pod created in a namespace
    labelled `NO_NODE_LABEL`; cluster-wide, applied once and left in place (it only concerns such namespaces)."""
    group = "/apis/admissionregistration.k8s.io/v1"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": NO_NODE_POLICY},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": (
                "Object{spec: Object.spec{schedulingGates: "
                f'[Object.spec.schedulingGates{{name: "{NO_NODE_LABEL}"}}]}}}}'
            )}}],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": NO_NODE_POLICY},
        "spec": {"policyName": NO_NODE_POLICY,
                 "matchResources": {"namespaceSelector": {"matchLabels": {NO_NODE_LABEL: "true"}}}},
    }  # fmt: skip
    return [(f"{group}/mutatingadmissionpolicies/{NO_NODE_POLICY}", policy),
            (f"{group}/mutatingadmissionpolicybindings/{NO_NODE_POLICY}", binding)]


@contextlib.asynccontextmanager
async def pods_ready(kube: KubeClient, namespace: str) -> AsyncIterator[None]:
    """While the block runs, every pod of `namespace` (present or new) is reported running and Ready."""
    task = asyncio.create_task(_report_forever(kube, namespace), name=f"kubelet {namespace}")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _report_forever(kube: KubeClient, namespace: str) -> None:
    """List, then watch from the list; list again after a 410, resume when a stream ends."""
    while True:
        listed = await kube.list(PODS, namespace=namespace)
        for pod in listed.items:
            await _report_ready(kube, pod)
        version = listed.resource_version
        with contextlib.suppress(Gone):
            while True:
                async for event in kube.watch(PODS, namespace=namespace, resource_version=version, timeout_seconds=60):
                    version = event.object["metadata"]["resourceVersion"]
                    if event.type in ("ADDED", "MODIFIED"):
                        await _report_ready(kube, event.object)


async def _report_ready(kube: KubeClient, pod: dict[str, Any]) -> None:
    metadata, status = pod["metadata"], pod.get("status") or {}
    ready = {c["type"] for c in status.get("conditions") or [] if c["status"] == "True"}
    if metadata.get("deletionTimestamp") or ready >= set(READY):
        return
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": kind, "status": "True", "lastTransitionTime": now} for kind in READY]
    with contextlib.suppress(NotFound):
        await kube.patch(PODS, namespace=metadata["namespace"], name=metadata["name"], subresource="status",
                         body={"status": {"phase": "Running", "startTime": now, "conditions": conditions}})
