"""The isolation canary on the real node: proven isolation lets scripts run, a network that ignores policies does not.

The rig isolates pods of namespaces named `*-scripts` (no route at all) and puts every other pod on its
bridge, where NetworkPolicies are stored but not enforced. Every canary target is a listener this file
starts on the bridge's host address (10.245.0.1, a port in 18000-18999): a TCP listener and a DNS
responder, never a real outside or metadata address. The scripts-manager and the operator run here, in
this process, against the rig's API server (the same code the release's pods run), each in namespaces
of this file's own (`canary-*`), deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from agent.sandbox import ScriptSandbox
from e2e.conftest import BRIDGE_HOST, HOST_PORTS, K8SREAL, Kubectl
from rockbot.cli import main
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeResponse
from rockbot.kube import AGENTS, NAMESPACES, KubeClient, NotFound
from rockbot.operator.settings import OperatorSettings
from rockbot.reachability import Targets
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.canary import host_listeners
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.buses import manager_and_agent
from tests.operator.harness import condition, operator_running
from tests.waiting import eventually

#: The rig's stand-in for python:3.12-slim, the script image (and, here, the agent image the canary uses).
IMAGE = "docker.io/library/python:3.12-slim"
ENFORCE = "this cluster does not enforce NetworkPolicy"


@pytest.fixture(autouse=True)
def rig(kubectl: Kubectl, crds: None, monkeypatch: pytest.MonkeyPatch) -> Kubectl:
    """The rig's API server, with the chart's CRDs, is every client's (the `kubectl` fixture fails at once, naming
    the fix, without it)."""
    monkeypatch.setenv("KUBECONFIG", str(K8SREAL / "kubeconfig"))
    return kubectl


def _free_pair() -> Iterator[tuple[int, int]]:
    ports = list(HOST_PORTS)
    secrets.SystemRandom().shuffle(ports)
    for tcp_port, dns_port in zip(ports[::2], ports[1::2], strict=False):
        with socket.socket() as tcp, socket.socket(type=socket.SOCK_DGRAM) as udp:
            try:
                tcp.bind((BRIDGE_HOST, tcp_port))
                udp.bind((BRIDGE_HOST, dns_port))
            except OSError:
                continue
        yield tcp_port, dns_port


@pytest.fixture
async def forbidden() -> AsyncIterator[Targets]:
    """A TCP listener and a DNS responder on the bridge host: what neither scripts nor agents may reach."""
    for tcp_port, dns_port in _free_pair():
        with contextlib.suppress(OSError):
            async with host_listeners(host=BRIDGE_HOST, tcp_port=tcp_port, dns_port=dns_port) as targets:
                yield {"outside": targets["host"][:1], "clusterDns": targets["host"][1:]}
                return
    pytest.fail(f"no two free ports in {HOST_PORTS.start}-{HOST_PORTS.stop - 1} on {BRIDGE_HOST}")


@contextlib.asynccontextmanager
async def namespace(suffix: str) -> AsyncIterator[str]:
    """A namespace of this file's own: `*-scripts` is isolated by the rig, anything else is on the bridge."""
    name = f"canary-{secrets.token_hex(3)}-{suffix}"
    async with await KubeClient.from_environment() as kube:
        await kube.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        try:
            yield name
        finally:
            with contextlib.suppress(NotFound):
                await kube.delete(NAMESPACES, name=name)


@contextlib.asynccontextmanager
async def scripts_manager(*, namespace: str, targets: Targets, enforce: bool = True) -> AsyncIterator[
        tuple[ScriptsManager, ScriptSandbox]]:  # fmt: skip
    settings = ScriptsManagerSettings(
        scripts_backend="pods", scripts_namespace=namespace, scripts_image=IMAGE, health_host="127.0.0.1",
        health_port=0, drain_seconds=0, scripts_isolation_targets=targets, scripts_isolation_enforce=enforce,
    )  # fmt: skip
    async with manager_and_agent() as (manager_bus, bus):
        manager = ScriptsManager(settings=settings, bus=manager_bus)
        await manager.start()
        try:
            yield manager, ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=180)
        finally:
            await manager.stop()


async def rockbot_status(capsys: pytest.CaptureFixture[str], *args: str, code: int) -> list[str]:
    """`rockbot status ...` (as a user runs it, against the rig) once it exits `code` (the Event follows the
    proof), bounded; its lines."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        capsys.readouterr()
        exited = await asyncio.to_thread(main, ["status", *args])
        lines = capsys.readouterr().out.splitlines()
        if exited == code or asyncio.get_running_loop().time() > deadline:
            assert exited == code, lines
            return lines
        await asyncio.sleep(0.5)


async def test_script_pods_of_an_isolated_namespace_reach_no_target_so_scripts_run(
    forbidden: Targets, capsys: pytest.CaptureFixture[str]
) -> None:
    async with namespace("scripts") as scripts, scripts_manager(namespace=scripts, targets=forbidden) as (
            manager, sandbox):  # fmt: skip
        result = await sandbox.execute_python_script(script="print(6 * 7)")
        proof = manager.canary.last  # type: ignore[union-attr]
        [status] = await rockbot_status(capsys, "--scripts-namespace", scripts, "-n", scripts, code=0)
    assert status.startswith(f"scripts-manager (scripts namespace {scripts}): EgressRestricted=True (NothingReached)")
    assert isinstance(result, ScriptInvokeResponse) and result.stdout == "42\n", result
    assert proof is not None and proof.isolated and len(proof.findings) == 2, proof
    for finding in proof.findings:  # the pod's own words: no route at all
        assert "Network is unreachable" in finding.detail or "no answer" in finding.detail, finding


async def test_script_pods_on_the_bridge_reach_the_targets_so_scripts_are_refused_and_enforce_false_runs_them(
    forbidden: Targets,
) -> None:
    tcp, dns = forbidden["outside"][0], forbidden["clusterDns"][0]
    async with namespace("bridge") as bridge:
        async with scripts_manager(namespace=bridge, targets=forbidden) as (manager, sandbox):
            refused = await sandbox.execute_python_script(script="print('must not run')")
            condition_line = manager.readiness.conditions()[0]
        async with scripts_manager(namespace=bridge, targets=forbidden, enforce=False) as (_, sandbox):
            ran = await sandbox.execute_python_script(script="print('ran anyway')")
    assert isinstance(refused, ScriptInvokeError), refused
    assert refused.error.code == ErrorCode.REJECTED
    assert f"script pods reached outside ({tcp}), clusterDns ({dns})" in refused.error.message
    assert ENFORCE in refused.error.message and "scripts.isolation.enforce=false" in refused.error.message
    assert condition_line.startswith("EgressRestricted=False (TargetsReached)")
    assert isinstance(ran, ScriptInvokeResponse) and ran.stdout == "ran anyway\n", ran


async def test_an_agent_namespace_on_the_bridge_shows_egress_not_restricted_naming_the_target(
    forbidden: Targets, capsys: pytest.CaptureFixture[str]
) -> None:
    tcp = forbidden["outside"][0]
    async with namespace("agents") as agents, await KubeClient.from_environment() as kube:
        await kube.create(AGENTS, namespace=agents, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "probed"},
            "spec": {"model": {"baseUrl": f"http://{BRIDGE_HOST}:18999/v1", "name": "m"}, "replicas": 0}})  # fmt: skip
        settings = OperatorSettings(namespaces=[agents], agent_image=IMAGE, egress_canary=True,
                                    egress_canary_targets={"outside": [tcp]})
        async with operator_running(settings):

            async def reported() -> dict:
                found = condition(await kube.get(AGENTS, namespace=agents, name="probed"), "EgressRestricted")
                assert found["status"] != "Unknown" or found["reason"] != "CanaryPending", found
                return found

            egress = await eventually(reported, within=180)
        _, agent = await rockbot_status(capsys, "--scripts-namespace", agents, "-n", agents, code=1)
    assert (egress["status"], egress["reason"]) == ("False", "TargetsReached"), egress
    assert agent.startswith(f"agent {agents}/probed: Ready=") and \
        f"EgressRestricted=False (TargetsReached): agent pods reached outside ({tcp})" in agent
    assert egress["message"].startswith(f"agent pods reached outside ({tcp}) in its last run: {ENFORCE}")
