"""`kubectl rollout restart` of the operator, the scripts-manager and the gateway loses nothing."""

from __future__ import annotations

import json

from e2e.conftest import Agent, Json, Kubectl, Release, pods_ready, restarts, until
from e2e.test_webhook import deliver, history, make_trigger
from tests.fixtures.llm import ScriptedLLM

RESTARTED = ("operator", "scripts-manager", "gateway")


def children(kubectl: Kubectl, agent: Agent) -> dict[str, str]:
    """The uid of each object the operator made for the Agent and controls (a re-made one has a new uid); the
    namespace's egress-canary account, which an Agent only co-owns and a canary may make at any time, is not one."""
    made: dict[str, str] = {}
    for kind in ("deployment", "service", "configmap", "serviceaccount", "secret"):
        for item in kubectl.json("get", kind, "-n", agent.namespace)["items"]:
            owners = item["metadata"].get("ownerReferences") or []
            if any(owner["kind"] == "Agent" and owner["name"] == agent.name and owner.get("controller")
                   for owner in owners):
                made[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["uid"]
    return made


def test_rolling_restarts_lose_no_run_no_child_and_no_script(
    agent: Agent, model: ScriptedLLM, kubectl: Kubectl, release: Release
) -> None:
    key = make_trigger(kubectl, agent=agent)
    before = children(kubectl, agent)
    earlier = [run["deliveryId"] for run in history(kubectl, agent.namespace)]
    # The run's model answer comes while the three restart: it must still be recorded, once.
    model.play({"text": "Answered across the restart.", "delay_seconds": 5})
    status, accepted = deliver(release, body=json.dumps({"issue": 8}).encode(), key=key, delivery="e2e-restart")
    assert status == 202, accepted

    for component in RESTARTED:
        kubectl.run("rollout", "restart", f"deployment/{release.name}-{component}", "-n", release.namespace)
    for component in RESTARTED:
        kubectl.run("rollout", "status", f"deployment/{release.name}-{component}", "-n", release.namespace,
                    "--timeout=180s", timeout=190)

    runs = until("the in-flight run recorded", lambda: [
        run for run in history(kubectl, agent.namespace) if run["deliveryId"] == "e2e-restart"], within=90)
    assert [(run["outcome"], run["summary"]) for run in runs] == [("Succeeded", "Answered across the restart.")]
    assert runs[0]["runId"] == accepted["runId"]
    assert [run["deliveryId"] for run in history(kubectl, agent.namespace)][: len(earlier)] == earlier
    model.play(
        {"tool_calls": [{"name": "execute_python_script", "arguments": {"script": "print(6 * 7)"}}]},
        {"text": "Still answering."},
    )
    assert agent.chat("Run a script after the restart.") == "Still answering."
    (result,) = [m["content"] for m in model.requests[-1].messages if m.get("role") == "tool"]
    assert "42" in result, result
    assert children(kubectl, agent) == before
    pods: list[Json] = release.pods()
    assert pods_ready(pods) and restarts(pods) == {}
