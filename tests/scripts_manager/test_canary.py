"""The isolation canary: its program, and the scripts-manager failing closed on what it finds.

Every target is a listener this test starts on 127.0.0.1 (`host_listeners`), never a real address.
The fake node runs pods with no network (a cluster that enforces the default-deny policy) or, with
`network=True`, on the host's network (a cluster that stores NetworkPolicies but does not enforce them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest

from agent.sandbox import ScriptSandbox
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeResponse
from rockbot.kube import EVENTS, KubeClient
from rockbot.reachability import PROBE, check_target, findings
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends.pod_manifests import REQUEST_LABEL
from rockbot.scripts_manager.canary import host_listeners
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.buses import manager_and_agent
from tests.kubeapi import KubeApiEmulator
from tests.scripts_manager.conftest import NS, MakeSettings, node
from tests.waiting import eventually

ENFORCE = "this cluster does not enforce NetworkPolicy"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def probe(targets: list[str], *, per_target: float = 1.0) -> dict[str, dict]:
    """The canary's program as a process of its own on this host: what it says of each target."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", PROBE, json.dumps(targets), str(per_target), stdout=subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), per_target + 10)  # bounded: the probe's own timeout
    assert process.returncode == 0
    (line,) = out.decode().splitlines()
    return {item["target"]: item for item in json.loads(line)["rockbot_reachability"]}


async def test_the_probe_reaches_listeners_and_not_what_does_not_answer() -> None:
    async with host_listeners() as targets:
        tcp, dns = targets["host"]
        silent = f"dns://127.0.0.1:{closed_port()}/canary.rockbot.invalid"
        refused = f"tcp://127.0.0.1:{closed_port()}"
        said = await probe([tcp, dns, silent, refused, "smtp://127.0.0.1:25"])
    assert said[tcp]["reached"] and said[tcp]["detail"] == "connected"
    assert said[dns]["reached"] and said[dns]["detail"] == "answered (rcode 3)"
    assert not said[silent]["reached"]
    assert not said[refused]["reached"] and "ConnectionRefusedError" in said[refused]["detail"]
    assert not said["smtp://127.0.0.1:25"]["reached"] and "not tcp://HOST:PORT" in said["smtp://127.0.0.1:25"]["detail"]


def test_targets_are_checked_naming_the_forms() -> None:
    for good in ("tcp://10.0.0.1:443", "tcp://[::1]:80", "dns:kubernetes.default.svc", "dns://10.0.0.10:53/x.y"):
        assert check_target(good) == good
    for bad in ("tcp://host", "http://a:1", "dns://10.0.0.10:53/", "10.0.0.1:443"):
        with pytest.raises(ValueError, match=re.escape("write tcp://HOST:PORT, dns:NAME or dns://SERVER:PORT/NAME")):
            check_target(bad)
    with pytest.raises(ValueError, match=r"scripts_isolation_targets(.|\n)*not a canary target"):
        ScriptsManagerSettings(scripts_isolation_targets={"outside": ["example.com"]})


def test_an_answer_that_leaves_out_a_target_is_no_proof() -> None:
    line = json.dumps({"rockbot_reachability": [{"target": "tcp://127.0.0.1:1", "reached": False}]})
    with pytest.raises(ValueError, match=re.escape("says nothing of tcp://127.0.0.1:2")):
        findings(line, targets={"a": ["tcp://127.0.0.1:1"], "b": ["tcp://127.0.0.1:2"]})
    with pytest.raises(ValueError, match="printed no answer"):
        findings("hello", targets={"a": ["tcp://127.0.0.1:1"]})


def test_the_broker_target_defaults_to_the_managers_own_broker_address() -> None:
    settings = ScriptsManagerSettings(amqp_url="amqp://u:p@rabbit.rockbot.svc:5673/", scripts_isolation_targets={})
    assert settings.isolation_targets == {"broker": ["tcp://rabbit.rockbot.svc:5673"]}
    off = ScriptsManagerSettings(amqp_url="amqp://u:p@rabbit:5672/", scripts_isolation_targets={"broker": []})
    assert off.isolation_targets == {"broker": []}


@contextlib.asynccontextmanager
async def manager_with(settings: ScriptsManagerSettings) -> AsyncIterator[tuple[ScriptsManager, ScriptSandbox]]:
    async with manager_and_agent() as (manager_bus, bus):
        manager = ScriptsManager(settings=settings, bus=manager_bus)
        await manager.start()
        try:
            yield manager, ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=60)
        finally:
            await manager.stop()


async def readyz(manager: ScriptsManager) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{manager.health.port}/readyz") as answer:
        return answer.status, await answer.text()


def sample(manager: ScriptsManager, name: str, **labels: str) -> float | None:
    return manager.metrics.registry.get_sample_value(name, labels)


async def test_local_sandbox_proves_it_reaches_nothing_of_the_host_and_says_so(make_settings: MakeSettings) -> None:
    async with manager_with(make_settings()) as (manager, sandbox):
        ok = await sandbox.execute_python_script(script="print('ran')")
        assert manager.canary is not None and manager.canary.last is not None
        proof = manager.canary.last
        status, text = await readyz(manager)
    assert isinstance(ok, ScriptInvokeResponse) and ok.stdout == "ran\n", ok
    assert proof.isolated and len(proof.findings) == 2, proof
    assert status == 200 and "EgressRestricted=True (NothingReached): local scripts reached none of host" in text
    for finding in proof.findings:
        assert sample(manager, "rockbot_isolation_reachable", scope="scripts", target=finding.target) == 0
    assert sample(manager, "rockbot_isolation_last_proof_timestamp_seconds", scope="scripts") == \
        proof.at.timestamp()


async def test_a_sandbox_on_the_hosts_network_refuses_scripts_naming_what_it_reached(
    make_settings: MakeSettings,
) -> None:
    async with manager_with(make_settings(scripts_local_isolation="unsafe-none")) as (manager, sandbox):
        refused = await sandbox.execute_python_script(script="print('must not run')")
        status, text = await readyz(manager)
        proof = manager.canary.last  # type: ignore[union-attr]
    assert isinstance(refused, ScriptInvokeError), refused
    assert (refused.error.code, refused.error.retryable) == (ErrorCode.REJECTED, False)
    tcp = next(f.target for f in proof.findings if f.target.startswith("tcp://"))
    assert f"local scripts reached host ({tcp})" in refused.error.message
    assert "install bubblewrap" in refused.error.message and "scripts.isolation.enforce=false" in refused.error.message
    assert status == 503 and "EgressRestricted=False (TargetsReached)" in text
    assert sample(manager, "rockbot_isolation_reachable", scope="scripts", target=tcp) == 1
    assert sample(manager, "rockbot_isolation_last_proof_timestamp_seconds", scope="scripts") == 0


async def test_enforce_false_runs_scripts_anyway_and_warns(
    make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(scripts_local_isolation="unsafe-none", scripts_isolation_enforce=False)
    with caplog.at_level(logging.WARNING, logger="rockbot.scripts_manager.canary"):
        async with manager_with(settings) as (manager, sandbox):
            ran = await sandbox.execute_python_script(script="print('ran anyway')")
            status, text = await readyz(manager)
    assert isinstance(ran, ScriptInvokeResponse) and ran.stdout == "ran anyway\n", ran
    assert status == 200 and "EgressRestricted=False (TargetsReached)" in text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("scripts run anyway" in w for w in warnings), warnings
    assert any("running a script although isolation is not proven" in w for w in warnings), warnings


async def canary_events(kube: KubeClient) -> list[dict]:
    return [e for e in (await kube.list(EVENTS, namespace=NS)).items if e["involvedObject"]["kind"] == "Namespace"]


async def test_script_pods_that_reach_nothing_run_scripts_and_an_event_says_isolation_is_proven(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with host_listeners() as targets, node(kube_api, kube) as kubelet:
        settings = make_settings(scripts_backend="pods", scripts_isolation_targets=targets)
        async with manager_with(settings) as (manager, sandbox):
            ok = await sandbox.execute_python_script(script="print(6 * 7)")
            proof = manager.canary.last  # type: ignore[union-attr]
    assert isinstance(ok, ScriptInvokeResponse) and ok.stdout == "42\n", ok
    assert proof.isolated and {f.target for f in proof.findings} == set(targets["host"])
    canary_pod = kubelet.seen[0]  # the canary is a script pod like any other, from the same builder
    script_labels = dict(kubelet.seen[1]["metadata"]["labels"])
    del script_labels[REQUEST_LABEL]  # the request a job's pod runs; the canary is nobody's request
    assert canary_pod["metadata"]["labels"] == script_labels
    assert canary_pod["spec"]["containers"][0]["command"] == kubelet.seen[1]["spec"]["containers"][0]["command"]
    [event] = await canary_events(kube)
    assert (event["type"], event["reason"]) == ("Normal", "IsolationProven")
    assert event["involvedObject"]["name"] == NS


async def test_script_pods_on_a_network_that_ignores_policies_are_refused_with_the_target_and_the_fix(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with host_listeners() as targets, node(kube_api, kube, network=True) as kubelet:
        settings = make_settings(scripts_backend="pods", scripts_isolation_targets=targets)
        async with manager_with(settings) as (manager, sandbox):
            refused = await sandbox.execute_python_script(script="print('must not run')")
            status, text = await readyz(manager)
    assert isinstance(refused, ScriptInvokeError), refused
    assert refused.error.code == ErrorCode.REJECTED
    tcp, dns = targets["host"]
    assert f"script pods reached host ({tcp}), host ({dns})" in refused.error.message
    assert ENFORCE in refused.error.message
    assert status == 503 and "EgressRestricted=False" in text
    assert len(kubelet.seen) == 1  # the canary's pod; the script never got one
    [event] = await canary_events(kube)
    assert (event["type"], event["reason"]) == ("Warning", "IsolationBreached") and ENFORCE in event["message"]


async def test_enforce_false_runs_script_pods_on_a_network_that_ignores_policies(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with host_listeners() as targets, node(kube_api, kube, network=True):
        settings = make_settings(scripts_backend="pods", scripts_isolation_targets=targets,
                                 scripts_isolation_enforce=False)
        async with manager_with(settings) as (manager, sandbox):
            ran = await sandbox.execute_python_script(script="print('ran anyway')")
            status, _ = await readyz(manager)
    assert isinstance(ran, ScriptInvokeResponse) and ran.stdout == "ran anyway\n", ran
    assert status == 200


async def test_a_canary_that_cannot_run_keeps_scripts_waiting_as_retryable(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with host_listeners() as targets:  # no node: the canary's pod never starts
        settings = make_settings(scripts_backend="pods", scripts_isolation_targets=targets,
                                 scripts_pod_start_seconds=1)
        async with manager_with(settings) as (manager, sandbox):
            await eventually(lambda: _ran(manager), within=30)
            refused = await sandbox.execute_python_script(script="print('must not run')")
    assert isinstance(refused, ScriptInvokeError), refused
    assert (refused.error.code, refused.error.retryable) == (ErrorCode.UNAVAILABLE, True)
    assert "the isolation canary could not run" in refused.error.message


async def _ran(manager: ScriptsManager) -> None:
    assert manager.canary is not None and manager.canary.last is not None, "the first canary has not finished"
