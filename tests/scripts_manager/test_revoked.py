"""A scripts-manager whose credentials the cluster revoked (its pod force-deleted, the process still alive) takes no
more scripts and fails none because of it (service.py, backends/pods.py).

On the real API server and the real broker: the manager is a real `rockbot scripts-manager` process acting as a
ServiceAccount of the test's own, with the chart's rights, and the test deletes that ServiceAccount, which revokes
its token at once, as deleting a pod revokes the token bound to it. No node runs the pods (each asks for more CPU
than a node here has), so a job whose pod was made stays on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rockbot.bus import SCRIPTS_MANAGER, AmqpBus, Delivery
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, ScriptInvokeError, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.kube import KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.cli import REVOKED_EXIT
from rockbot.scripts_manager.service import STOPPED
from tests.buses import ALICE
from tests.fixtures.kube_real import KubeCluster
from tests.fixtures.rabbitmq import Vhost
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.test_over_rabbitmq import _answered_and_drained, _send_collecting_answers
from tests.scripts_manager.test_reaping import Manager, manager_process, manager_settings, pods_of
from tests.waiting import eventually

ACCOUNT = "doomed-scripts-manager"
#: The rights the chart gives the scripts-manager in the scripts namespace (charts/.../scripts-manager-rbac.yaml).
RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/attach"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["create", "get", "list", "update", "delete"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
]


@contextlib.asynccontextmanager
async def doomed_manager(vhost: Vhost, cluster: KubeCluster, namespace: str, folder: Path, *, lease_seconds: int
                         ) -> AsyncIterator[Manager]:  # fmt: skip
    """A ready `rockbot scripts-manager` process (pod backend, JSON logs as deployed) acting as a ServiceAccount of
    `namespace` with the chart's rights, which `revoke` deletes."""
    kubeconfig = account_kubeconfig(cluster, namespace, folder / "doomed")
    settings = manager_settings(namespace=namespace, amqp_url=await vhost.url(SCRIPTS_MANAGER),
                                pod="scripts-manager-doomed", lease_seconds=lease_seconds)
    async with manager_process({**settings, "drain_seconds": 1}, kubeconfig=kubeconfig, log_format="json") as doomed:
        await eventually(lambda: ready(doomed.health_port), within=60)
        yield doomed


def account_kubeconfig(cluster: KubeCluster, namespace: str, path: Path) -> Path:
    """A kubeconfig acting as a ServiceAccount of `namespace` with the chart's rights there."""
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ACCOUNT, "namespace": namespace}, "rules": RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ACCOUNT, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}]},
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    token = cluster.token(namespace=namespace, service_account=ACCOUNT)
    return cluster.kubeconfig_for(token=token, path=path, namespace=namespace)


async def revoke(cluster: KubeCluster, namespace: str, kubeconfig: Path) -> None:
    """Delete the ServiceAccount, and wait until the API server refuses its token."""
    cluster.kubectl("delete", "serviceaccount", ACCOUNT, "-n", namespace)

    async def refused() -> None:
        result = await asyncio.to_thread(cluster.kubectl, "get", "pods", "-n", namespace, kubeconfig=kubeconfig,
                                         check=False)
        assert "Unauthorized" in result.stderr, (result.returncode, result.stderr)

    await eventually(refused, within=30)


async def ready(port: int) -> None:
    """The manager answers /readyz with 200: it consumes script requests."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError as exc:
        raise AssertionError(f"the health server is not up yet: {exc}") from None
    writer.write(b"GET /readyz HTTP/1.0\r\nHost: manager\r\n\r\n")
    status = (await reader.readline()).decode()
    writer.close()
    assert " 200 " in status, status


def request(name: str, script: str) -> ScriptInvokeRequest:
    return ScriptInvokeRequest(request_id=f"{name}-{uuid.uuid4().hex[:8]}", agent="alice", script=script,
                               timeout_seconds=30)


async def exits_revoked(doomed: Manager, *, within: float) -> dict[str, Any]:
    """Wait for the exit code of a manager whose credentials were revoked; its one critical JSON line saying so."""
    async with asyncio.timeout(within):
        assert await doomed.process.wait() == REVOKED_EXIT
    lines = [json.loads(line) for line in doomed.log().splitlines() if line.startswith("{")]
    (found,) = [line for line in lines if line["level"] == "CRITICAL"]
    assert "no longer accepts this scripts-manager's credentials" in found["message"], found
    return found


async def test_a_job_a_revoked_manager_could_not_start_goes_back_to_the_queue_and_a_live_manager_runs_it(
    vhost: Vhost, make_settings: MakeSettings, real_kube_client: KubeClient, kube_cluster: KubeCluster,
    kube_namespace: str, tmp_path: Path,
) -> None:
    asked = request("handed-back", "print('ran on the live manager')")
    async with await AmqpBus.connect(url=await vhost.url(ALICE)) as agent:
        # A five-minute Lease: its renewal does not meet the revocation first; the job's pod create does.
        async with doomed_manager(vhost, kube_cluster, kube_namespace, tmp_path, lease_seconds=300) as doomed:
            await revoke(kube_cluster, kube_namespace, tmp_path / "doomed")
            replies, answers = await _send_collecting_answers(agent, asked)
            await exits_revoked(doomed, within=60)
        assert answers == []  # handed back, not answered
        assert await pods_of(real_kube_client, kube_namespace, asked) == []  # its pod was never made
        live = ScriptsManager(settings=make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER)))  # local sandbox
        await live.start()
        try:
            await eventually(lambda: _answered_and_drained(vhost, replies, answers), within=60)
        finally:
            await live.stop()
    assert len(answers) == 1, answers
    reply = answers[0].decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(reply, ScriptInvokeResponse), reply
    assert (reply.request_id, reply.exit_code, reply.stdout) == (asked.request_id, 0, "ran on the live manager\n")


async def test_a_job_whose_pod_a_revoked_manager_made_is_answered_as_stopped_and_the_manager_exits(
    vhost: Vhost, real_kube_client: KubeClient, kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path,
) -> None:
    asked = request("stopped", "print('never runs: no node takes its pod')")
    async with await AmqpBus.connect(url=await vhost.url(ALICE)) as agent:
        async with doomed_manager(vhost, kube_cluster, kube_namespace, tmp_path, lease_seconds=300) as doomed:
            replies, answers = await _send_collecting_answers(agent, asked)

            async def on_its_pod() -> None:
                assert await pods_of(real_kube_client, kube_namespace, asked)

            await eventually(on_its_pod, within=60)
            await revoke(kube_cluster, kube_namespace, tmp_path / "doomed")
            await exits_revoked(doomed, within=60)
        await eventually(lambda: _answered_and_drained(vhost, replies, answers), within=30)
    assert len(answers) == 1, answers
    assert_stopped(answers[0], asked)


def assert_stopped(answer: Delivery, asked: ScriptInvokeRequest) -> None:
    reply = answer.decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(reply, ScriptInvokeError), reply
    assert (reply.request_id, reply.error.code, reply.error.retryable, reply.error.message) == (
        asked.request_id, ErrorCode.UNAVAILABLE, True, STOPPED)
    assert answer.user_id == SCRIPTS_MANAGER.user


async def test_a_manager_with_no_job_stops_as_soon_as_its_lease_renewal_is_refused(
    vhost: Vhost, kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path,
) -> None:
    # A three-second Lease, renewed every second.
    async with doomed_manager(vhost, kube_cluster, kube_namespace, tmp_path, lease_seconds=3) as doomed:
        await revoke(kube_cluster, kube_namespace, tmp_path / "doomed")
        assert "401 Unauthorized" in (await exits_revoked(doomed, within=30))["message"]
