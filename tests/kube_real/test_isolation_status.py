"""The isolation canary's published proof on the real API server: `rockbot status` reads it (and the Agents'
conditions) as a reader with only `events list` and `agents list`; a NetworkPolicy change makes a new proof.

No node here (control plane only), so the canary runs in the local sandbox, the way the existing local tests
prove it; what it publishes, and what starts it again, go through the real API server. Every canary target is
a listener this test starts on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from rockbot.kube import AGENTS, EVENTS, NETWORKPOLICIES, KubeClient
from rockbot.reachability import PROOF_ANNOTATION, IsolationMetrics
from rockbot.scripts_manager.app import namespace_events
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.canary import IsolationCanary, host_listeners
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.policy_watch import PolicyWatch
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.kube_real import KubeCluster, fresh_namespace
from tests.waiting import eventually

READER_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: isolation-reader, namespace: {namespace}}}
rules: [{{apiGroups: ["{group}"], resources: ["{resource}"], verbs: ["list"]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: isolation-reader, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: isolation-reader}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {home}}}]
"""


@contextlib.asynccontextmanager
async def canary_publishing(kube: KubeClient, *, namespace: str, changes: PolicyWatch | None = None,
                            debounce: float = 0.0) -> AsyncIterator[IsolationCanary]:  # fmt: skip
    """The scripts-manager's canary on the local sandbox, posting its proofs on `namespace` as the manager does."""
    settings = ScriptsManagerSettings(scripts_backend="local")
    backend = await LocalBackend.create(settings=settings)
    await backend.start()
    canary = IsolationCanary(
        backend=backend, targets=host_listeners, enforce=True, interval_seconds=600,
        metrics=IsolationMetrics(registry=ScriptMetrics(backend="local").registry, scope="scripts"),
        first_proof_seconds=60, post_event=namespace_events(kube, namespace=namespace), changes=changes,
        debounce_seconds=debounce,
    )  # fmt: skip
    task = asyncio.create_task(canary.run())
    try:
        yield canary
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await backend.close()


def rockbot_status(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, in a process of its own."""
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "rockbot.cli", "status", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def reader(cluster: KubeCluster, *, home: str, grants: list[tuple[str, str, str]], path: Path) -> Path:
    """A ServiceAccount of `home` granted `list` of (namespace, group, resource) only; its kubeconfig."""
    cluster.kubectl("create", "serviceaccount", path.name, "-n", home)
    for namespace, group, resource in grants:
        cluster.kubectl("apply", "-f", "-", input=READER_ROLE.format(
            namespace=namespace, group=group, resource=resource, account=path.name, home=home))
    token = cluster.token(namespace=home, service_account=path.name)
    return cluster.kubeconfig_for(token=token, path=path, namespace=home)


def until_authorised(command: list[str], *, within: float = 15.0) -> subprocess.CompletedProcess[str]:
    """Run the command until the bindings just written reach the authorizer (a refusal at first is expected)."""
    deadline = time.monotonic() + within
    while True:
        result = rockbot_status(*command)
        if "forbidden" not in result.stderr.lower() or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


async def published(kube: KubeClient, namespace: str, *, count: int) -> list[str]:
    """The reasons of the canary's Events, once there are `count` (the Event follows the proof)."""
    reasons = [e["reason"] for e in (await kube.list(EVENTS, namespace=namespace)).items]
    assert len(reasons) >= count, reasons
    return reasons


async def test_status_as_a_reader_with_list_rights_only_shows_the_proof_and_each_agents_conditions(
    kube_cluster: KubeCluster, kube_namespace: str, real_kube_client: KubeClient, tmp_path: Path,
) -> None:
    kube = real_kube_client
    with fresh_namespace(kube_cluster, purpose="status-scripts") as scripts:
        async with canary_publishing(kube, namespace=scripts) as canary:
            proof = await canary.first_proof()
            await eventually(lambda: published(kube, scripts, count=1))
        assert proof is not None and proof.isolated
        await kube.create(AGENTS, namespace=kube_namespace, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "analyst"},
            "spec": {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m"}, "replicas": 0}})  # fmt: skip
        conditions = [  # as the operator writes them
            {"type": "Ready", "status": "True", "reason": "Available", "message": "0 of 0 replicas ready",
             "lastTransitionTime": "2026-11-27T03:00:00Z"},
            {"type": "EgressRestricted", "status": "False", "reason": "TargetsReached",
             "message": "agent pods reached outside (tcp://127.0.0.1:9) in its last run: fix it",
             "lastTransitionTime": "2026-11-27T03:00:00Z"},
        ]  # fmt: skip
        await kube.patch(AGENTS, namespace=kube_namespace, name="analyst", subresource="status",
                         body={"status": {"conditions": conditions}})
        both = reader(kube_cluster, home=kube_namespace, path=tmp_path / "auditor", grants=[
            (scripts, "", "events"), (kube_namespace, "rockbot.dev", "agents")])  # fmt: skip
        result = until_authorised(["--kubeconfig", str(both), "--scripts-namespace", scripts])
        agents_only = reader(kube_cluster, home=kube_namespace, path=tmp_path / "agents-only",
                             grants=[(kube_namespace, "rockbot.dev", "agents")])
        refused = until_authorised(["--kubeconfig", str(agents_only), "--scripts-namespace", scripts])
        events = (await kube.list(EVENTS, namespace=scripts)).items
    assert result.returncode == 1, result  # the agent's isolation is not proven
    scripts_line, agent_line = result.stdout.splitlines()
    assert scripts_line.startswith(f"scripts-manager (scripts namespace {scripts}): EgressRestricted=True "
                                   "(NothingReached): script pods reached none of host (tcp://127.0.0.1:")
    assert proof.at.strftime("%Y-%m-%dT%H:%M:%SZ") in scripts_line
    assert agent_line == f"agent {kube_namespace}/analyst: Ready=True (Available); EgressRestricted=False " \
        "(TargetsReached): agent pods reached outside (tcp://127.0.0.1:9) in its last run: fix it"
    assert [e["reason"] for e in events] == ["IsolationProven"] and PROOF_ANNOTATION in \
        events[0]["metadata"]["annotations"]
    assert refused.returncode == 2 and "events list in the scripts namespace" in refused.stderr, refused


async def test_a_networkpolicy_change_in_the_scripts_namespace_makes_a_new_proof(
    kube_cluster: KubeCluster, kube_namespace: str, real_kube_client: KubeClient,
) -> None:
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny"},
              "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    watch = PolicyWatch(kube=real_kube_client, namespace=kube_namespace)
    async with canary_publishing(real_kube_client, namespace=kube_namespace, changes=watch, debounce=0.5) as canary:
        first = await canary.first_proof()
        assert first is not None and watch.listed.is_set()

        async def proven_after(previous) -> object:
            assert canary.last is not None and canary.last.at > previous.at, "no new proof yet"
            return canary.last

        await real_kube_client.create(NETWORKPOLICIES, namespace=kube_namespace, body=policy)
        second = await eventually(lambda: proven_after(first), within=60)
        await real_kube_client.delete(NETWORKPOLICIES, namespace=kube_namespace, name="deny")
        third = await eventually(lambda: proven_after(second), within=60)
        reasons = await eventually(lambda: published(real_kube_client, kube_namespace, count=3))
    assert third.isolated  # type: ignore[attr-defined]
    assert reasons == ["IsolationProven"] * 3, reasons


async def test_without_the_right_to_watch_networkpolicies_the_watch_says_why_once_and_ends(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path, caplog,
) -> None:
    """An older chart's Role: the canary is not held up, and the log names the right to grant, once."""
    config = reader(kube_cluster, home=kube_namespace, grants=[], path=tmp_path / "no-rights")
    async with await KubeClient.from_environment(config_file=str(config)) as kube:
        watch = PolicyWatch(kube=kube, namespace=kube_namespace)
        await asyncio.wait_for(watch.run(lambda why: None), timeout=30)
    assert watch.listed.is_set()
    refusals = [record for record in caplog.records if "networkpolicies list and watch" in record.getMessage()]
    assert len(refusals) == 1
