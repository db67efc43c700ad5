"""Issue 19's "done when" on the real cluster: a chat through an Agent's Service is a run that `rockbot runs show`
prints through the console's read API (as a user with a token and the viewer role), with its script's output and
pod; the conversation continues after `kubectl rollout restart` of the Agent, and is whole on whichever of its two
replicas answers. It uses the checks' shared Agent, and leaves it at two replicas (the later checks talk to it
through its Service or inbox, which either replica answers)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

from e2e.conftest import Agent, Json, Kubectl, Release, pods_ready, role_token, session_runs, until
from rockbot.console.store_models import RunSummary
from tests.agent.test_a2a import a2a_client, answer_of, ask
from tests.fixtures.llm import ScriptedLLM


def a2a_turn(url: str, *, token: str, context: str, text: str) -> str:
    """One turn of conversation `context` over A2A (the agent keeps it, keyed by the contextId); its answer."""

    async def send() -> str:
        async with a2a_client(url, token=token, streaming=False) as client:
            [event] = [event async for event in client.send_message(ask(text, context_id=context))]
            return answer_of(event.task)

    return asyncio.run(send())


def rockbot_runs(*args: str, url: str, token: str) -> str:
    """`rockbot runs ARGS` against the console, as a user would run it."""
    done = subprocess.run(
        [sys.executable, "-m", "rockbot.cli", "runs", *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONSAFEPATH": "1", "ROCKBOT_CONSOLE_URL": url, "ROCKBOT_CONSOLE_TOKEN": token},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def reader(kubectl: Kubectl, release: Release, namespace: str) -> Iterator[str]:
    """A token of a ServiceAccount bound to the chart's console viewer role in the release's namespace."""
    with role_token(kubectl, release, namespace, account="reader", role="console-viewer") as token:
        yield token


def service_url(kubectl: Kubectl, name: str, namespace: str) -> str:
    service = kubectl.json("get", "service", name, "-n", namespace)["spec"]
    return f"http://{service['clusterIP']}:{service['ports'][0]['port']}"


def agent_pods(kubectl: Kubectl, agent: Agent) -> list[Json]:
    selector = f"app.kubernetes.io/name=rockbot-agent,app.kubernetes.io/instance={agent.name}"
    return [pod for pod in kubectl.json("get", "pods", "-n", agent.namespace, "-l", selector)["items"]
            if not pod["metadata"].get("deletionTimestamp")]  # fmt: skip


def routed(kubectl: Kubectl, agent: Agent) -> set[str]:
    """The addresses the Agent's Service sends to: its ready endpoints (as kube-proxy and the rig's stand-in do)."""
    slices = kubectl.json("get", "endpointslices", "-n", agent.namespace, "-l",
                          f"kubernetes.io/service-name=rockbot-{agent.name}")  # fmt: skip
    return {address for slice_ in slices["items"] for endpoint in slice_.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready") for address in endpoint["addresses"]}  # fmt: skip


def test_a_chat_is_a_run_and_its_conversation_outlives_a_restart_on_either_replica(
    agent: Agent, kubectl: Kubectl, release: Release, model: ScriptedLLM, reader: str
) -> None:
    token = agent.http_token()
    console = service_url(kubectl, f"{release.name}-console", release.namespace)
    context = f"e2e-{secrets.token_hex(4)}"
    said: list[str] = []

    def recorded() -> list[RunSummary]:
        """The conversation's runs, through the read API with the reader's token, once every turn said succeeded (a
        next turn, on any replica, reads them)."""

        def succeeded() -> list[RunSummary] | None:
            runs = [run for run in session_runs(console, token=reader, agent=agent, session=context, limit=50)
                    if run.outcome == "Succeeded"]  # fmt: skip
            return runs if len(runs) == len(said) else None

        return until(f"{len(said)} runs of the conversation recorded", succeeded, within=60)

    def turn(url: str, text: str, answer: str) -> None:
        """A turn whose model request must hold every earlier turn of the conversation; then its run is recorded."""
        model.play({"text": answer})
        assert a2a_turn(url, token=token, context=context, text=text) == answer
        said.append(text)
        sent = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
        assert sent == said, "the conversation lost a turn"
        recorded()

    service = service_url(kubectl, f"rockbot-{agent.name}", agent.namespace)
    model.play({"tool_calls": [{"name": "execute_python_script", "arguments": {"script": "print(6 * 7)"}}]})
    turn(service, "I am Ann. What is 6 x 7?", "Ann, it is 42.")
    (run,) = recorded()
    shown = rockbot_runs("show", run.run_id, url=console, token=reader)
    assert f"session {context}" in shown and "outcome Succeeded" in shown, shown
    assert "tool      execute_python_script" in shown and "user      I am Ann. What is 6 x 7?" in shown, shown
    assert "script    exit 0 on pods rockbot-script-" in shown and "stdout: 42" in shown, shown

    # Every pod replaced, and two of them: the conversation can only be the store's.
    before = {pod["metadata"]["name"] for pod in agent_pods(kubectl, agent)}
    kubectl.run("patch", "agent", agent.name, "-n", agent.namespace, "--type=merge", "-p", '{"spec":{"replicas":2}}')
    kubectl.run("rollout", "restart", f"deployment/rockbot-{agent.name}", "-n", agent.namespace)
    kubectl.run("rollout", "status", f"deployment/rockbot-{agent.name}", "-n", agent.namespace, "--timeout=180s",
                timeout=190)  # fmt: skip
    pods = until("two new agent pods Ready", lambda: (found := agent_pods(kubectl, agent)) and len(found) == 2
                 and pods_ready(found) and not before & {pod["metadata"]["name"] for pod in found} and found,
                 within=120)  # fmt: skip
    addresses = {pod["status"]["podIP"] for pod in pods}
    until("the Service routing to the new pods only", lambda: routed(kubectl, agent) == addresses, within=60)
    turn(service, "Who am I?", "You are Ann.")
    port = pods[0]["spec"]["containers"][0]["ports"][0]["containerPort"]
    for n, pod in enumerate(pods):  # each replica in turn
        turn(f"http://{pod['status']['podIP']}:{port}", f"Question {n} for {pod['metadata']['name']}?", f"Answer {n}.")
    assert len(said) == 4
