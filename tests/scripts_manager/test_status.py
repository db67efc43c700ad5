"""`rockbot status` in-process: the scripts-manager's and the operator's canaries run on fake nodes, the command
reads what they published (an Event per proof, the Agents' conditions) and says whether isolation is proven.

Every canary target is a listener this test starts on 127.0.0.1, never a real address.
"""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import pytest
import yaml

from rockbot.cli import main
from rockbot.kube import AGENTS, NAMESPACES, KubeClient
from rockbot.operator.settings import OperatorSettings
from rockbot.reachability import PROOF_ANNOTATION, Proof, PublishedProof
from rockbot.scripts_manager.canary import host_listeners
from rockbot.status import Condition, agent_lines, scripts_line
from tests.kubeapi import KubeApiEmulator
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body
from tests.operator.test_egress_canary import NS as AGENTS_NS
from tests.operator.test_egress_canary import create_basics
from tests.operator.test_egress_canary import node as agent_node
from tests.scripts_manager.conftest import NS, MakeSettings, node
from tests.scripts_manager.test_canary import manager_with
from tests.waiting import eventually

NOW = datetime.datetime(2026, 11, 27, 3, 0, tzinfo=datetime.UTC)


def event(proof: Proof, *, status: str = "True", interval: float = 600.0) -> dict:
    published = PublishedProof.of(proof, Condition("EgressRestricted", status, "NothingReached", "m"),  # type: ignore[arg-type]
                                  enforce=True, interval_seconds=interval)
    return {"metadata": {"annotations": {PROOF_ANNOTATION: published.model_dump_json()}}}


def test_the_newest_proof_is_the_scripts_managers_line_and_a_stale_or_missing_one_is_not_proven() -> None:
    old, new = Proof(at=NOW - datetime.timedelta(minutes=9)), Proof(at=NOW - datetime.timedelta(minutes=1))
    line = scripts_line([event(new), event(old, status="False"), {"metadata": {}}], namespace=NS, now=NOW)
    assert line.proven and line.text() == f"scripts-manager (scripts namespace {NS}): EgressRestricted=True " \
        "(NothingReached): m"
    stale = scripts_line([event(old, interval=60)], namespace=NS, now=NOW)
    assert not stale.proven and "(ProofStale): the last proof (True, 2026-11-27T02:51:00Z) is older than two" in \
        stale.text()
    missing = scripts_line([], namespace=NS, now=NOW)
    assert not missing.proven and "(NoProof)" in missing.text() and "--scripts-namespace" in missing.text()


def test_an_agent_without_egress_restricted_is_not_proven() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "Available", "message": "1 of 1 ready"}
    [line] = agent_lines([{"metadata": {"namespace": "team", "name": "a"}, "status": {"conditions": [ready]}}])
    assert not line.proven
    assert line.text() == "agent team/a: Ready=True (Available); EgressRestricted=Unknown (NotReported): the " \
        "operator has not reported it"


async def rockbot_status(*args: str) -> int:
    """`rockbot status ...` as a user runs it (in a thread: its client must not share the emulator's loop)."""
    return await asyncio.to_thread(main, ["status", *args])


async def test_status_says_script_pods_are_proven_and_names_what_agent_pods_reached(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings, kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await create_basics(kube)
    await kube.create(AGENTS, namespace=AGENTS_NS, body=agent_body("analyst"))
    async with host_listeners() as targets, node(kube_api, kube), agent_node(kube_api, kube, network=True):
        settings = make_settings(scripts_backend="pods", scripts_isolation_targets=targets)
        operator = OperatorSettings(namespaces=[AGENTS_NS], agent_image="registry.example/rockbot:test",
                                    egress_canary=True, egress_canary_targets={"outside": targets["host"][:1]})
        async with manager_with(settings) as (manager, _), operator_running(operator):
            await eventually(lambda: _proven(manager), within=60)

            async def reported() -> None:
                found = condition(await kube.get(AGENTS, namespace=AGENTS_NS, name="analyst"), "EgressRestricted")
                assert found["status"] == "False", found

            await eventually(reported, within=60)
        capsys.readouterr()
        code = await rockbot_status("--kubeconfig", str(kubeconfig), "-n", AGENTS_NS, "--scripts-namespace", NS)
    scripts, agent = capsys.readouterr().out.splitlines()
    assert code == 1  # the agents' isolation is not proven
    tcp, dns = targets["host"]
    assert scripts.startswith(f"scripts-manager (scripts namespace {NS}): EgressRestricted=True (NothingReached): "
                              f"script pods reached none of host ({tcp}), host ({dns}) at ")
    assert agent.startswith(f"agent {AGENTS_NS}/analyst: Ready=")
    assert f"; EgressRestricted=False (TargetsReached): agent pods reached outside ({tcp}) in its last run: " \
        "this cluster does not enforce NetworkPolicy" in agent


async def _proven(manager) -> None:
    assert manager.canary.last is not None and manager.canary.last.isolated, manager.canary.last


async def test_status_without_a_cluster_says_how_to_point_at_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await rockbot_status("--kubeconfig", str(tmp_path / "missing"))
    assert code == 2
    assert capsys.readouterr().err.startswith(f"rockbot status: no kubeconfig file at {tmp_path / 'missing'}")


def with_contexts(kubeconfig: Path, path: Path) -> Path:
    """The emulator's kubeconfig plus a context `team` (namespace team), the current one a server that is gone."""
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"].append({"name": "team", "context": {**config["contexts"][0]["context"], "namespace": "team"}})
    config["clusters"].append({"name": "gone", "cluster": {"server": "http://127.0.0.1:1"}})
    config["contexts"].append({"name": "gone", "context": {"cluster": "gone", "user": "tester"}})
    config["current-context"] = "gone"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_status_takes_the_context_and_its_namespace_from_the_kubeconfig(
    kube: KubeClient, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As with kubectl: --context picks a context other than the current one, and its namespace is the Agents'."""
    path = with_contexts(kubeconfig, tmp_path / "two-contexts")
    await kube.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    await kube.create(AGENTS, namespace="team", body=agent_body("scout", namespace="team"))
    capsys.readouterr()
    code = await rockbot_status("--kubeconfig", str(path), "--context", "team", "--scripts-namespace", NS)
    scripts, agent = capsys.readouterr().out.splitlines()
    assert code == 1 and "(NoProof)" in scripts
    assert agent.startswith("agent team/scout: Ready=Unknown (NotReported)")


async def test_status_local_proves_the_local_sandbox_now(capsys: pytest.CaptureFixture[str]) -> None:
    code = await rockbot_status("--local")
    [line] = capsys.readouterr().out.splitlines()
    assert code == 0, line
    assert line.startswith("sandbox (rockbot local): EgressRestricted=True (NothingReached): local scripts reached "
                           "none of host (tcp://127.0.0.1:")
