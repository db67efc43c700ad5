"""Issue 32's "done when" on the real node: Ann tells an Agent a fact in one conversation through the console, and
gets it back in a new conversation after every pod of the Agent was replaced; Bob, another person, does not. The
memory is kept by the console in the chart's PostgreSQL (pgvector), embedded by the scripted server's
/v1/embeddings, and Ann finds it, and forgets it, with `rockbot memories`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from e2e.conftest import Json, Kubectl, Release, agent_manifest, until, wait_for_agent
from e2e.test_runs import service_url
from tests.fixtures.llm import EMBEDDING_MODEL, ScriptedLLM

AGENT = "e2e-memory"
FACT = "Our deployment window is Tuesday 14:00 to 16:00 UTC."


def console_chat(console: str, *, token: str, namespace: str, session: str, text: str) -> str:
    """One turn through the console's chat as the token's person; the answer's text (from its Server-Sent Events)."""
    request = urllib.request.Request(
        f"{console}/agents/{namespace}/{AGENT}/chat", method="POST",
        data=json.dumps({"session": session, "message": text}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        events = response.read().decode().split("\n\n")
    for event in events:
        kind, _, data = event.partition("\ndata: ")
        if kind in ("event: answer", "event: error"):
            body = json.loads(data)
            assert kind == "event: answer", body
            return str(body["answer"])
    raise AssertionError(f"no answer in {events!r}")


def rockbot_memories(*args: str, url: str, token: str) -> str:
    environment = {**os.environ, "PYTHONSAFEPATH": "1", "ROCKBOT_CONSOLE_URL": url, "ROCKBOT_CONSOLE_TOKEN": token}
    done = subprocess.run([sys.executable, "-m", "rockbot.cli", "memories", *args], capture_output=True, text=True,
                          timeout=60, check=False, env=environment)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def people(kubectl: Kubectl, release: Release, namespace: str) -> Iterator[dict[str, str]]:
    """Ann's and Bob's tokens: ServiceAccounts that may see the release's Agents and chat with them."""
    binding = f"e2e-memory-chat-{namespace}"
    tokens = {}
    for person in ("ann", "bob"):
        kubectl.run("create", "serviceaccount", person, "-n", namespace)
        tokens[person] = kubectl.run("create", "token", person, "-n", namespace, "--duration=30m").strip()
    kubectl.run("create", "rolebinding", binding, "-n", release.namespace,
                f"--clusterrole={release.name}-console-agent-operator", f"--serviceaccount={namespace}:ann",
                f"--serviceaccount={namespace}:bob")  # fmt: skip
    try:
        yield tokens
    finally:
        kubectl.run("delete", "rolebinding", binding, "-n", release.namespace, "--ignore-not-found", check=False)


def memory_agent(release: Release) -> Json:
    manifest = agent_manifest(name=AGENT, model_url=release.model_url)
    manifest["spec"]["memory"] = {"longTerm": {
        "enabled": True, "scope": "Caller", "embeddings": {"model": EMBEDDING_MODEL},
        "autoRecall": {"maxItems": 3, "minScore": 0.2},
    }}  # fmt: skip
    return manifest


def pod_names(kubectl: Kubectl, namespace: str) -> set[str]:
    selector = f"app.kubernetes.io/name=rockbot-agent,app.kubernetes.io/instance={AGENT}"
    return {pod["metadata"]["name"] for pod in kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]}


def recalled(model: ScriptedLLM) -> str:
    """What the automatic recall put into the last model request (its tool message), or ''."""
    return "\n".join(m["content"] for m in model.requests[-1].messages
                     if m["role"] == "tool" and m["content"].startswith("Long-term memory"))  # fmt: skip


def test_ann_gets_her_fact_back_in_a_new_conversation_after_the_pods_were_replaced_and_bob_does_not(
    kubectl: Kubectl, release: Release, model: ScriptedLLM, people: dict[str, str], namespace: str
) -> None:
    ns = release.namespace
    kubectl.apply(memory_agent(release), namespace=ns)
    try:
        wait_for_agent(kubectl, name=AGENT, namespace=ns)
        console = service_url(kubectl, f"{release.name}-console", ns)
        model.play({"tool_calls": [{"name": "remember", "arguments": {"text": FACT, "tags": ["deploys"]}}]},
                   {"text": "Noted, Ann."})  # fmt: skip
        told = "Please remember: our deployment window is Tuesday 14:00 to 16:00 UTC."
        assert console_chat(console, token=people["ann"], namespace=ns, session="monday", text=told) == "Noted, Ann."
        remembered = [m["content"] for m in model.requests[-1].messages if m["role"] == "tool"]
        assert remembered and remembered[-1].startswith("Remembered as m-"), remembered

        before = pod_names(kubectl, ns)
        kubectl.run("rollout", "restart", f"deployment/rockbot-{AGENT}", "-n", ns)
        kubectl.run("rollout", "status", f"deployment/rockbot-{AGENT}", "-n", ns, "--timeout=240s", timeout=260)
        until("every pod of the Agent replaced", lambda: pod_names(kubectl, ns).isdisjoint(before)
              and pod_names(kubectl, ns), within=120)  # fmt: skip
        wait_for_agent(kubectl, name=AGENT, namespace=ns)

        model.play({"text": "Tuesday, 14:00 to 16:00 UTC."})
        assert console_chat(console, token=people["ann"], namespace=ns, session="tuesday",
                            text="When is our deployment window?") == "Tuesday, 14:00 to 16:00 UTC."
        assert json.dumps(FACT) in recalled(model), model.requests[-1].messages

        model.play({"text": "I do not know."})
        assert console_chat(console, token=people["bob"], namespace=ns, session="tuesday",
                            text="When is our deployment window?") == "I do not know."
        assert FACT not in json.dumps(model.requests[-1].messages)

        listed = rockbot_memories("list", url=console, token=people["ann"])
        assert FACT in listed and AGENT in listed, listed
        assert FACT not in rockbot_memories("list", url=console, token=people["bob"])
        memory_id = next(word for word in listed.split() if word.startswith("m-"))
        assert f"forgotten {memory_id}" in rockbot_memories("forget", memory_id, url=console, token=people["ann"])
        assert "(no memories)" in rockbot_memories("list", url=console, token=people["ann"])
    finally:
        kubectl.run("delete", "agent", AGENT, "-n", ns, "--ignore-not-found", "--wait=false", check=False)
