"""A signed webhook reaches a Trigger through the gateway's Service; a wrongly signed one is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import urllib.error
import urllib.request

from e2e.conftest import Agent, Json, Kubectl, Release, until
from tests.fixtures.llm import ScriptedLLM

TRIGGER = "e2e-hook"


def send(release: Release, *, body: bytes, key: bytes, delivery: str) -> tuple[int, Json]:
    """POST a webhook to the gateway's Service, signed as GitHub signs (X-Hub-Signature-256)."""
    service = release.kubectl.json("get", "service", f"{release.name}-gateway", "-n", release.namespace)["spec"]
    request = urllib.request.Request(
        f"http://{service['clusterIP']}:{service['ports'][0]['port']}/hooks/{release.namespace}/{TRIGGER}",
        data=body, method="POST",
        headers={"Content-Type": "application/json", "X-GitHub-Delivery": delivery,
                 "X-Hub-Signature-256": "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def make_trigger(kubectl: Kubectl, *, agent: Agent) -> bytes:
    """The webhook Trigger of `agent` (made once, with a random key); its key, once the Trigger is Ready."""
    if not kubectl.run("get", "secret", "e2e-hook-key", "-n", agent.namespace, "--ignore-not-found", "-o", "name"):
        kubectl.run("create", "secret", "generic", "e2e-hook-key", "-n", agent.namespace,
                    f"--from-literal=key={secrets.token_hex(16)}")
    kubectl.apply({
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "Trigger", "metadata": {"name": TRIGGER},
        "spec": {"agentRef": {"name": agent.name}, "webhook": {"secretKeyRef": {"name": "e2e-hook-key", "key": "key"}},
                 "prompt": "Issue {{ payload.issue }} was opened.", "successfulRunsHistoryLimit": 10},
    }, namespace=agent.namespace)  # fmt: skip
    kubectl.run("wait", f"triggers/{TRIGGER}", "-n", agent.namespace, "--for=condition=Ready", "--timeout=60s",
                timeout=70)
    return kubectl.secret("e2e-hook-key", "key", namespace=agent.namespace).encode()


def deliver(release: Release, *, body: bytes, key: bytes, delivery: str) -> tuple[int, Json]:
    """`send`, again while the gateway answers 503 (it has not seen the Trigger or its Agent Ready yet)."""
    return until(f"the gateway to take delivery {delivery}", lambda: (
        answer if (answer := send(release, body=body, key=key, delivery=delivery))[0] != 503 else None), within=60)


def history(kubectl: Kubectl, namespace: str) -> list[Json]:
    return (kubectl.json("get", "trigger", TRIGGER, "-n", namespace).get("status") or {}).get("history") or []


def test_a_signed_webhook_reaches_its_trigger(agent: Agent, model: ScriptedLLM, kubectl: Kubectl,
                                              release: Release) -> None:
    model.play({"text": "Triaged issue 7."})
    key = make_trigger(kubectl, agent=agent)
    body = json.dumps({"issue": 7}).encode()

    wrong, refusal = send(release, body=body, key=b"not the key", delivery="e2e-wrong")
    status, accepted = deliver(release, body=body, key=key, delivery="e2e-1")

    assert wrong == 401, refusal
    assert status == 202, accepted
    runs = until("the run recorded in the Trigger's history", lambda: [
        run for run in history(kubectl, agent.namespace) if run["deliveryId"] == "e2e-1"], within=60)
    assert [(run["outcome"], run["summary"]) for run in runs] == [("Succeeded", "Triaged issue 7.")]
    assert runs[0]["runId"] == accepted["runId"]
    assert [m["content"] for m in model.requests[0].messages if m["role"] == "user"] == ["Issue 7 was opened."]
