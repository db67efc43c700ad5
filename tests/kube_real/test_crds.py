"""rockbot's CRDs on the real API server: accepted (CEL cost within budget), served, and validating, defaulting
and pruning as `kubectl` users will see it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rockbot import crdgen
from tests.fixtures.kube_real import REPO, KubeCluster

MERGE = "application/merge-patch+json"


def agent(name: str, **spec) -> dict:
    base = {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m"}}
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name}, "spec": base | spec}


def tool(name: str, **spec) -> dict:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Tool", "metadata": {"name": name},
            "spec": {"description": "d", **spec}}


@pytest.mark.parametrize("folder", ["crds", "charts/rockbot/crds"])
def test_every_crd_is_accepted_by_a_server_side_apply(kube_cluster: KubeCluster, folder: str) -> None:
    files = sorted((REPO / folder).glob("*.yaml"))
    assert len(files) == len(crdgen.RESOURCES)
    for path in files:
        done = kube_cluster.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                                    "--field-manager=rockbot-tests", "-f", str(path))
        assert "serverside-applied" in done.stdout, done.stdout


def test_rockbot_kinds_are_discoverable_with_their_subresources_and_category(kube_cluster: KubeCluster) -> None:
    status, body = kube_cluster.request("GET", "/apis/rockbot.dev/v1alpha1")
    assert status == 200
    served = {r["name"]: r for r in body["resources"]}
    for plural in ("agents", "tools", "scheduledtasks", "triggers"):
        assert {plural, f"{plural}/status"} <= set(served)
        assert served[plural]["namespaced"] is True and "rockbot" in served[plural]["categories"]
    assert served["agents"]["kind"] == "Agent"


class Api:
    """POST/PATCH rockbot objects in one namespace, returning (status, body)."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def path(self, plural: str, name: str = "") -> str:
        return f"/apis/rockbot.dev/v1alpha1/namespaces/{self.namespace}/{plural}" + (f"/{name}" if name else "")

    def create(self, plural: str, body: dict) -> tuple[int, dict]:
        return self.cluster.request("POST", self.path(plural), body=body)

    def merge(self, plural: str, name: str, patch: dict) -> tuple[int, dict]:
        return self.cluster.request("PATCH", self.path(plural, name), body=patch, content_type=MERGE)


@pytest.fixture
def api(kube_cluster: KubeCluster, kube_namespace: str) -> Api:
    return Api(kube_cluster, kube_namespace)


def test_a_missing_required_field_is_named(api: Api) -> None:
    bad = agent("a")
    del bad["spec"]["model"]["name"]
    status, body = api.create("agents", bad)
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith('Agent.rockbot.dev "a" is invalid: [spec.model.name: Required value, ')
    assert body["details"]["causes"][0] == {"reason": "FieldValueRequired", "message": "Required value",
                                            "field": "spec.model.name"}


def test_schema_bounds_types_enums_and_patterns_are_checked(api: Api) -> None:
    status, body = api.create("agents", agent("a", maxIterations=0, replicas="two"))
    assert status == 422
    assert "spec.maxIterations: Invalid value: 0: spec.maxIterations in body should be greater than or equal to 1" \
        in body["message"]
    assert 'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer' in body["message"]
    status, body = api.create("tools", tool("t", functionName="bad name!",
                                            rest={"url": "https://example.com", "method": "FETCH"}))
    assert status == 422
    assert "spec.functionName in body should match" in body["message"]
    assert 'spec.rest.method: Unsupported value: "FETCH"' in body["message"]
    status, body = api.create("tools", tool("p", script={"source": "1", "pipPackages": ["x" * 201]}))
    assert status == 422
    assert "spec.script.pipPackages[0]: Too long: may not be more than 200 bytes" in body["message"]


def test_defaults_are_applied_and_unknown_fields_pruned(api: Api) -> None:
    body = agent("d")
    body["spec"]["unknownField"] = "dropped"
    body["status"] = {"conditions": []}
    status, created = api.create("agents", body)
    assert status == 201, created
    assert created["spec"]["maxIterations"] == 10 and created["spec"]["parallelToolCalls"] is True
    assert "unknownField" not in created["spec"]
    assert "status" not in created  # create ignores .status: it is a subresource


def test_cel_rules_report_their_field_and_message(api: Api) -> None:
    status, body = api.create("tools", tool("t", rest={"url": "https://x"}, script={"source": "print(1)"}))
    assert status == 422
    assert body["message"] == ('Tool.rockbot.dev "t" is invalid: spec: Invalid value: '
                               "a Tool has exactly one backend: set one of rest, mcp, script, agent or a2a")
    status, body = api.create("tools", tool("u", rest={"url": "ftp://x"}))
    assert status == 422 and "spec.rest: " in body["message"] and "http://" in body["message"]


def test_updates_are_validated_too(api: Api) -> None:
    assert api.create("agents", agent("u"))[0] == 201
    status, body = api.merge("agents", "u", {"spec": {"model": {"name": None}}})
    assert status == 422 and "spec.model.name: Required value" in body["message"]


def test_a_set_list_refuses_a_repeated_item(api: Api) -> None:
    status, body = api.create("agents", agent("a", tools=["weather", "news", "weather"]))
    assert status == 422
    assert body["message"] == 'Agent.rockbot.dev "a" is invalid: spec.tools[2]: Duplicate value: "weather"'
    assert body["details"]["causes"] == [{"reason": "FieldValueDuplicate", "message": 'Duplicate value: "weather"',
                                          "field": "spec.tools[2]"}]


def test_status_is_written_only_through_its_subresource(api: Api, kube_cluster: KubeCluster) -> None:
    assert api.create("agents", agent("s"))[0] == 201
    status, patched = api.merge("agents", "s", {"status": {"observedGeneration": 1}})
    assert status == 200 and "status" not in patched
    status, patched = kube_cluster.request("PATCH", api.path("agents", "s") + "/status",
                                           body={"status": {"observedGeneration": 1}}, content_type=MERGE)
    assert status == 200 and patched["status"]["observedGeneration"] == 1


def test_the_chart_crds_are_the_ones_the_suite_applies() -> None:
    top = {path.name: path.read_bytes() for path in (REPO / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in Path(REPO / "charts/rockbot/crds").glob("*.yaml")}
    assert top == chart
