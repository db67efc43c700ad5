"""CRDs: discovery, schema validation with the real server's wording, defaults, pruning, CEL rules."""

import asyncio

from rockbot.kube import CRDS, DEPLOYMENTS, KubeClient
from tests.fixtures.kubeapi import apply_crd, client_for, delete_crd
from tests.kubeapi.http import MERGE, call

AGENTS = "/apis/rockbot.dev/v1alpha1/namespaces/default/agents"
TOOLS = "/apis/rockbot.dev/v1alpha1/namespaces/default/tools"
GADGETS = "/apis/example.com/v1/namespaces/default/gadgets"


def agent(name: str, **spec) -> dict:
    base = {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m"}}
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name}, "spec": base | spec}


def gadget_crd(rule: str, message: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Gadget", "plural": "gadgets", "shortNames": ["gd"], "categories": ["things"]},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "x-kubernetes-validations": [{"rule": rule, "message": message}],
                    "properties": {"size": {"type": "integer"}, "items": {"type": "array",
                                                                           "items": {"type": "string"}}},
                }},
            }}}],
        },
    }


async def test_rockbot_crds_are_discoverable(kube_api):
    status, body = await call(kube_api, "GET", "/apis/rockbot.dev/v1alpha1")
    assert status == 200
    served = {r["name"]: r for r in body["resources"]}
    assert {"agents", "agents/status", "tools", "tools/status", "scheduledtasks"} <= set(served)
    assert served["agents"]["kind"] == "Agent" and "rockbot" in served["agents"]["categories"]


async def test_missing_required_field_is_named_like_the_real_server(kube_api):
    bad = agent("a")
    del bad["spec"]["model"]["name"]
    status, body = await call(kube_api, "POST", AGENTS, bad)
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == 'Agent.rockbot.dev "a" is invalid: spec.model.name: Required value'
    assert body["details"]["causes"] == [{"reason": "FieldValueRequired", "message": "Required value",
                                          "field": "spec.model.name"}]


async def test_schema_bounds_enums_and_patterns_are_checked(kube_api):
    status, body = await call(kube_api, "POST", AGENTS, agent("a", maxIterations=0, replicas="two"))
    assert status == 422
    assert "spec.maxIterations: Invalid value: 0: spec.maxIterations in body should be greater than or equal to 1" \
        in body["message"]
    assert 'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer' in body["message"]
    tool = {"metadata": {"name": "t"}, "spec": {"description": "d", "functionName": "bad name!",
                                                "rest": {"url": "https://example.com", "method": "FETCH"}}}
    status, body = await call(kube_api, "POST", TOOLS, tool)
    assert status == 422
    assert "spec.functionName in body should match" in body["message"]
    assert 'spec.rest.method: Unsupported value: "FETCH"' in body["message"]


async def test_defaults_are_applied_and_unknown_fields_pruned(kube_api):
    body = agent("d")
    body["spec"]["unknownField"] = "dropped"
    status, created = await call(kube_api, "POST", AGENTS, body)
    assert status == 201, created
    assert created["spec"]["maxIterations"] == 10 and created["spec"]["parallelToolCalls"] is True
    assert "unknownField" not in created["spec"]
    assert "status" not in created  # create ignores .status: it is a subresource


async def test_cel_rules_report_their_message(kube_api):
    two_backends = {"metadata": {"name": "t"}, "spec": {"description": "d", "rest": {"url": "https://x"},
                                                        "script": {"source": "print(1)"}}}
    status, body = await call(kube_api, "POST", TOOLS, two_backends)
    assert status == 422
    assert body["message"].startswith('Tool.rockbot.dev "t" is invalid: spec: Invalid value: "object": ')
    assert "exactly one backend" in body["message"]
    status, body = await call(kube_api, "POST", TOOLS, {"metadata": {"name": "u"},
                                                        "spec": {"description": "d", "rest": {"url": "ftp://x"}}})
    assert status == 422 and "spec.rest: " in body["message"] and "http://" in body["message"]


async def test_updates_are_validated_too(kube_api):
    await call(kube_api, "POST", AGENTS, agent("u"))
    status, body = await call(kube_api, "PATCH", f"{AGENTS}/u", {"spec": {"model": {"name": None}}},
                              content_type=MERGE)
    assert status == 422 and "spec.model.name: Required value" in body["message"]


async def test_custom_crd_with_a_transition_rule_and_its_lifecycle(kube_api):
    async with client_for(kube_api) as client:
        await apply_crd(client, gadget_crd("!has(oldSelf.size) || self.size >= oldSelf.size", "size cannot shrink"))
        _, discovered = await call(kube_api, "GET", "/apis/example.com/v1")
        gadgets = next(r for r in discovered["resources"] if r["name"] == "gadgets")
        assert gadgets["shortNames"] == ["gd"] and gadgets["namespaced"] is True
        status, _ = await call(kube_api, "POST", GADGETS, {"metadata": {"name": "g"}, "spec": {"size": 2}})
        assert status == 201
        status, _ = await call(kube_api, "PATCH", f"{GADGETS}/g", {"spec": {"size": 3}}, content_type=MERGE)
        assert status == 200
        status, body = await call(kube_api, "PATCH", f"{GADGETS}/g", {"spec": {"size": 1}}, content_type=MERGE)
        assert status == 422 and body["message"].endswith('spec: Invalid value: "object": size cannot shrink')
        await delete_crd(client, "gadgets.example.com")
    status, _ = await call(kube_api, "GET", GADGETS)
    assert status == 404


async def test_bad_crds_are_refused(kube_api):
    async with client_for(kube_api) as client:
        bad_rule = gadget_crd("self.size >", "broken")
        status, body = await call(kube_api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                  bad_rule)
        assert status == 422 and "compilation failed" in body["message"]
        wrong_name = gadget_crd("true", "ok")
        wrong_name["metadata"]["name"] = "gadgets.other.com"
        status, body = await call(kube_api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                  wrong_name)
        assert status == 422 and "metadata.name" in body["message"]
        listed = await client.list(CRDS)
        assert "gadgets.example.com" not in {crd["metadata"]["name"] for crd in listed.items}


async def test_deployment_controller_reports_replicas_ready(kube_api, deployment_controller, kube_client: KubeClient):
    body = {"metadata": {"name": "web"}, "spec": {
        "replicas": 2, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "main", "image": "example/web:1"}]}}}}
    await kube_client.create(DEPLOYMENTS, namespace="default", body=body)
    async with asyncio.timeout(5):
        while True:
            current = await kube_client.get(DEPLOYMENTS, namespace="default", name="web")
            status = current.get("status") or {}
            if status.get("observedGeneration") == current["metadata"]["generation"]:
                break
            await asyncio.sleep(0.01)
    assert status["readyReplicas"] == 2
    assert {c["type"]: c["status"] for c in status["conditions"]}["Available"] == "True"


async def test_a_set_list_refuses_a_repeated_item_like_the_real_server(kube_api):
    status, body = await call(kube_api, "POST", AGENTS, agent("a", tools=["weather", "news", "weather"]))
    assert status == 422
    assert body["message"] == 'Agent.rockbot.dev "a" is invalid: spec.tools[2]: Duplicate value: "weather"'
    assert body["details"]["causes"] == [{"reason": "FieldValueDuplicate", "message": 'Duplicate value: "weather"',
                                          "field": "spec.tools[2]"}]
