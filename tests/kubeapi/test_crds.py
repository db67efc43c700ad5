"""The emulator's CRDs: discovery, defaults and pruning (what the real server refuses: tests/kube_real)."""

from tests.kubeapi.http import call

AGENTS = "/apis/rockbot.dev/v1alpha1/namespaces/default/agents"


def agent(name: str, **spec) -> dict:
    base = {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m"}}
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name}, "spec": base | spec}


async def test_rockbot_crds_are_discoverable(kube_api):
    status, body = await call(kube_api, "GET", "/apis/rockbot.dev/v1alpha1")
    assert status == 200
    served = {r["name"]: r for r in body["resources"]}
    assert {"agents", "agents/status", "tools", "tools/status", "scheduledtasks"} <= set(served)
    assert served["agents"]["kind"] == "Agent" and "rockbot" in served["agents"]["categories"]


async def test_defaults_are_applied_and_unknown_fields_pruned(kube_api):
    body = agent("d")
    body["spec"]["unknownField"] = "dropped"
    status, created = await call(kube_api, "POST", AGENTS, body)
    assert status == 201, created
    assert created["spec"]["maxIterations"] == 10 and created["spec"]["parallelToolCalls"] is True
    assert "unknownField" not in created["spec"]
    assert "status" not in created  # create ignores .status: it is a subresource
