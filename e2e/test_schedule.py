"""A ScheduledTask fires on the real clock and records what its agent answered."""

from __future__ import annotations

from e2e.conftest import Agent, Kubectl, until
from tests.fixtures.llm import ScriptedLLM


def test_a_scheduled_task_fires_on_the_real_clock(agent: Agent, model: ScriptedLLM, kubectl: Kubectl) -> None:
    model.play({"text": "Good morning: nothing to report."})
    task = {
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask", "metadata": {"name": "e2e-every-ten-seconds"},
        "spec": {"agentRef": {"name": agent.name}, "schedule": "*/10 * * * * *", "runOnce": True,
                 "prompt": "Anything to report?"},
    }  # fmt: skip
    kubectl.apply(task, namespace=agent.namespace)
    try:
        status = until("the task's run recorded as Succeeded", lambda: _history(kubectl, agent), within=90)
    finally:
        kubectl.run("delete", "scheduledtask", "e2e-every-ten-seconds", "-n", agent.namespace, "--ignore-not-found")
    (run,) = status["history"]
    assert run["outcome"] == "Succeeded", run
    assert run["summary"] == "Good morning: nothing to report."
    assert int(run["scheduledTime"][17:19]) % 10 == 0, run  # a slot of the schedule, to the second
    assert [m["content"] for m in model.requests[0].messages if m["role"] == "user"] == ["Anything to report?"]


def _history(kubectl: Kubectl, agent: Agent) -> dict | None:
    status = kubectl.json("get", "scheduledtask", "e2e-every-ten-seconds", "-n", agent.namespace).get("status") or {}
    return status if status.get("history") else None
