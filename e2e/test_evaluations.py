"""Issue 33 on the real node: an Evaluation applied beside the checks' shared Agent is run by the operator through
the Agent's inbox and its status shows the score; a recorded chat whose model ran a script replays in recorded mode
(`rockbot replay`, as a user with the chart's agent-operator role) with the script's recorded output and no script
run: the scripts-manager's `rockbot_scripts_runs_total` stays where it was."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from e2e.conftest import Agent, Json, Kubectl, Release, role_token, session_runs, until
from e2e.test_runs import a2a_turn, service_url
from tests.fixtures.llm import ScriptedLLM, Turn


def answer(body: Json) -> Turn:
    return Turn(text="It is 42." if "40 + 2" in body["messages"][-1]["content"] else "Hello there.")


SCRIPT = {"tool_calls": [{"name": "execute_python_script", "arguments": {"script": "print(6 * 7)"}}]}


def test_an_evaluation_of_the_shared_agent_runs_and_its_status_shows_the_score(
    agent: Agent, kubectl: Kubectl, model: ScriptedLLM
) -> None:
    name = f"e2e-{secrets.token_hex(3)}"
    model.play(*[answer] * 2)  # one turn per case, whichever comes first
    kubectl.apply({"apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": name},
                   "spec": {"agentRef": {"name": agent.name}, "concurrency": 1, "cases": [
                       {"name": "sums", "input": "What is 40 + 2?", "expect": {"contains": ["42"], "maxToolCalls": 0}},
                       {"name": "greets", "input": "Say hello.", "expect": {"contains": ["Hello"]}},
                   ]}}, namespace=agent.namespace)  # fmt: skip
    began = time.monotonic()
    try:

        def scored() -> Json | None:
            status = kubectl.json("get", "evaluation", name, "-n", agent.namespace).get("status") or {}
            return status if status.get("trend") and not status.get("active") else None

        status = until(f"Evaluation {name} run by the operator", scored, within=120)
        print(f"\nEvaluation of 2 cases on the real node: status scored after {time.monotonic() - began:.1f} s")
        assert status["score"] == 1.0, status
        assert {(c["name"], c["result"]) for c in status["cases"]} == {("sums", "Passed"), ("greets", "Passed")}
        assert status["trend"][0]["reason"] == "Spec" and status["model"] == model.model, status
        assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "True", "Passed": "True"}
        shown = kubectl.run("get", "evaluation", name, "-n", agent.namespace)
        assert re.search(rf"{name}\s+{agent.name}\s+True\s+1\b", shown), shown  # Agent, Passed, Score columns
    finally:
        kubectl.run("delete", "evaluation", name, "-n", agent.namespace, "--ignore-not-found", check=False)


@pytest.fixture
def chatter(kubectl: Kubectl, release: Release, namespace: str) -> Iterator[str]:
    """A token of a ServiceAccount bound to the chart's agent-operator role (sees Agents and their runs, chats)."""
    with role_token(kubectl, release, namespace, account="replayer", role="console-agent-operator") as token:
        yield token


def scripts_run(kubectl: Kubectl, release: Release) -> float:
    """Script requests answered by every scripts-manager replica (`rockbot_scripts_runs_total`, all outcomes)."""
    pods = kubectl.json("get", "pods", "-n", release.namespace, "-l",
                        "app.kubernetes.io/component=scripts-manager")["items"]  # fmt: skip
    total = 0.0
    for pod in pods:
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/metrics", timeout=10) as response:
            text = response.read().decode()
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("rockbot_scripts_runs_total{"))  # fmt: skip
    return total


def test_a_recorded_run_replays_in_recorded_mode_without_running_its_script(
    agent: Agent, kubectl: Kubectl, release: Release, model: ScriptedLLM, chatter: str
) -> None:
    token = agent.http_token()
    console = service_url(kubectl, f"{release.name}-console", release.namespace)
    context = f"e2e-replay-{secrets.token_hex(4)}"
    before = scripts_run(kubectl, release)
    model.play(SCRIPT, {"text": "It is 42."})
    assert a2a_turn(service_url(kubectl, f"rockbot-{agent.name}", agent.namespace), token=token, context=context,
                    text="What is 6 x 7? Compute it.") == "It is 42."  # fmt: skip
    until("the chat's script counted by the scripts-manager", lambda: scripts_run(kubectl, release) == before + 1,
          within=30)  # fmt: skip

    run = until("the chat recorded", lambda: next((run for run in session_runs(
        console, token=chatter, agent=agent, session=context, limit=5) if run.outcome == "Succeeded"), None),
        within=60)  # fmt: skip
    model.play(SCRIPT, {"text": "It is 42."})
    done = subprocess.run(
        [sys.executable, "-m", "rockbot.cli", "replay", run.run_id, "--mode", "recorded", "--json"],
        capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "PYTHONSAFEPATH": "1", "ROCKBOT_CONSOLE_URL": console, "ROCKBOT_CONSOLE_TOKEN": chatter},
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)  # 0: the replay did the same
    comparison = json.loads(done.stdout)
    [call] = comparison["replay"]["tool_calls"]
    assert (call["name"], call["status"]) == ("execute_python_script", "ok"), call
    assert "--- stdout ---\n42\n" in call["result"], call  # the recorded output, as the original run's tool got it
    assert comparison["replay"]["answer"] == "It is 42." and comparison["replay"]["run_id"] != run.run_id
    assert scripts_run(kubectl, release) == before + 1, "the replay ran a script"
