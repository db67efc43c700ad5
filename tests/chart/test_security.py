"""Least privilege in the rendered chart: who is bound to what, and how every pod runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.chart.combinations import COMBINATIONS
from tests.chart.conftest import NAMESPACE, Manifest
from tests.chart.pod_security import pod_specs, restricted_violations

Render = Callable[..., list[Manifest]]

OPERATOR_SA = "rockbot-operator"
SCRIPTS_MANAGER_SA = "rockbot-scripts-manager"


def rule_set(rules: list[dict]) -> set[tuple[str, str, str]]:
    """RBAC rules flattened to (apiGroup, resource, verb) triples, so equal rights compare equal."""
    triples = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    triples.add((group, resource, verb))
    return triples


def expand(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for resource in resources for verb in verbs}


OPERATOR_RIGHTS = (
    expand("rockbot.dev", ["agents", "tools", "scheduledtasks"], ["get", "list", "watch", "patch", "update"])
    | expand("rockbot.dev", ["scheduledtasks"], ["create", "delete"])
    | expand("rockbot.dev", ["agents/status", "tools/status", "scheduledtasks/status"], ["get", "patch", "update"])
    | expand("apps", ["deployments"], ["get", "list", "watch", "create", "patch"])
    | expand("", ["serviceaccounts", "configmaps", "services"], ["get", "list", "watch", "create", "patch"])
    | expand("", ["secrets"], ["get", "create"])
    | expand("", ["events"], ["create", "patch"])
    | expand("events.k8s.io", ["events"], ["create", "patch"])
    | expand("", ["namespaces"], ["get", "list", "watch"])
    | expand("apiextensions.k8s.io", ["customresourcedefinitions"], ["get", "list", "watch"])
)

SCRIPTS_MANAGER_RIGHTS = (
    expand("", ["pods"], ["create", "get", "list", "watch", "delete", "deletecollection"])
    | expand("", ["pods/log"], ["get"])
    | expand("", ["configmaps"], ["create", "get", "list", "delete", "deletecollection"])
)


def bindings(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")]


@pytest.mark.parametrize("name", COMBINATIONS)
def test_only_the_operator_and_the_scripts_manager_are_bound_to_any_role(render: Render, name: str) -> None:
    """Agent ServiceAccounts (made by the operator) and every other identity are bound to nothing."""
    for binding in bindings(render(COMBINATIONS[name])):
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", f"{binding['metadata']['name']} binds a {subject['kind']}"
            assert subject["namespace"] == NAMESPACE
            assert subject["name"] in (OPERATOR_SA, SCRIPTS_MANAGER_SA)
            assert "agent" not in subject["name"]


def test_operator_cluster_role_has_exactly_the_rights_it_uses(render: Render) -> None:
    manifests = render()
    (role,) = [m for m in manifests if m["kind"] == "ClusterRole"]
    assert rule_set(role["rules"]) == OPERATOR_RIGHTS
    (binding,) = [m for m in manifests if m["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": NAMESPACE}]
    # Children are removed by the garbage collector through owner references, never by the operator.
    assert not {t for t in rule_set(role["rules"]) if t[2] == "delete" and t[1] != "scheduledtasks"}


def test_scripts_manager_rights_stop_at_the_scripts_namespace(render: Render) -> None:
    manifests = render(COMBINATIONS["everything"])
    granted = [b for b in bindings(manifests) if any(s["name"] == SCRIPTS_MANAGER_SA for s in b["subjects"])]
    assert [b["kind"] for b in granted] == ["RoleBinding"]
    (binding,) = granted
    assert binding["metadata"]["namespace"] == "rockbot-scripts"
    assert binding["roleRef"]["kind"] == "Role"
    (role,) = [m for m in manifests if m["kind"] == "Role" and m["metadata"]["name"] == binding["roleRef"]["name"]]
    assert role["metadata"]["namespace"] == "rockbot-scripts"
    assert rule_set(role["rules"]) == SCRIPTS_MANAGER_RIGHTS


@pytest.mark.parametrize("name", COMBINATIONS)
def test_every_pod_complies_with_pod_security_restricted(render: Render, name: str) -> None:
    specs = [spec for manifest in render(COMBINATIONS[name]) for spec in pod_specs(manifest)]
    assert specs
    for spec in specs:
        assert restricted_violations(spec) == []


@pytest.mark.parametrize("name", COMBINATIONS)
def test_every_container_is_bounded_and_has_a_read_only_root(render: Render, name: str) -> None:
    for manifest in render(COMBINATIONS[name]):
        for spec in pod_specs(manifest):
            for container in spec["containers"]:
                where = f"{manifest['metadata']['name']}/{container['name']}"
                assert {"cpu", "memory"} <= set(container["resources"]["limits"]), where
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, where


@pytest.mark.parametrize("name", COMBINATIONS)
def test_only_pods_that_use_the_kubernetes_api_get_a_token(render: Render, name: str) -> None:
    manifests = render(COMBINATIONS[name])
    for account in (m for m in manifests if m["kind"] == "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False, account["metadata"]["name"]
    for manifest in manifests:
        for spec in pod_specs(manifest):
            uses_api = spec["serviceAccountName"] in (OPERATOR_SA, SCRIPTS_MANAGER_SA)
            assert spec["automountServiceAccountToken"] is uses_api, manifest["metadata"]["name"]


def test_restricted_check_names_each_broken_rule() -> None:
    """The Pod Security check itself: a pod breaking every rule gets one finding per rule."""
    spec = {
        "hostNetwork": True,
        "securityContext": {"runAsUser": 0, "sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
        "volumes": [{"name": "host", "hostPath": {"path": "/"}}, {"name": "nfs", "nfs": {"server": "x", "path": "/"}}],
        "containers": [{
            "name": "bad",
            "ports": [{"containerPort": 80, "hostPort": 80}],
            "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]},
                                "seccompProfile": {"type": "Unconfined"}, "procMount": "Unmasked",
                                "seLinuxOptions": {"type": "spc_t"}},
        }],
    }
    found = {violation.split(":")[0] for violation in restricted_violations(spec)}
    assert found == {
        "hostNamespaces", "hostPathVolumes", "sysctls", "privileged", "capabilities_baseline", "hostPorts",
        "procMount", "seccompProfile_baseline", "seLinuxOptions", "restrictedVolumes", "runAsUser",
        "allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile_restricted", "capabilities_restricted",
    }


def test_restricted_check_accepts_pod_level_defaults() -> None:
    spec = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "ok",
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
        }],
    }
    assert restricted_violations(spec) == []
