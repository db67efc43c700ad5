"""Least privilege in the rendered chart: who is bound to what, and how every pod runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.chart.combinations import COMBINATIONS
from tests.chart.conftest import NAMESPACE, Manifest
from tests.chart.rbac import (
    GATEWAY_SA,
    OPERATOR_SA,
    SCRIPTS_MANAGER_SA,
    Grant,
    Right,
    allowed,
    expand,
    grants_of,
    named_rules,
)
from tests.fixtures.kube_real import POD_SECURITY_RESTRICTED

Render = Callable[..., list[Manifest]]

EGRESS_CANARY_RIGHTS = (expand("", ["pods"], ["create", "watch", "delete"])
                        | expand("networking.k8s.io", ["networkpolicies"], ["list"]))
# Exactly what the operator uses on objects in the namespaces it watches (test_operator_rbac.py checks
# this list against the requests of a real run); granted per namespace unless it watches all of them.
OPERATOR_RIGHTS = (
    expand("rockbot.dev", ["agents"], ["get", "list", "watch"])
    | expand("rockbot.dev", ["tools"], ["list", "watch"])
    | expand("rockbot.dev", ["scheduledtasks"], ["get", "list", "watch", "create", "patch", "delete"])
    | expand("rockbot.dev", ["evaluations"], ["get", "list", "watch"])
    | expand("rockbot.dev", ["agents/status", "tools/status", "scheduledtasks/status", "evaluations/status"],
             ["patch"])
    | expand("apps", ["deployments"], ["get", "list", "watch", "create", "patch"])
    | expand("", ["serviceaccounts", "configmaps", "services"], ["get", "list", "watch", "create", "patch"])
    | expand("", ["secrets"], ["get", "create"])
    | expand("", ["events"], ["create"])
    # The egress canary (on by default; agents.egressCanary.enabled=false takes these away): its own pods
    # made, followed to their end and deleted, and the NetworkPolicies that decide which Agents share one.
    | EGRESS_CANARY_RIGHTS
)
# Cluster-scoped and read-only: kopf's discovery of CRDs, and of namespaces when it watches a list of them.
#: The replicas' leader election: their one Lease, in the release namespace (get and update by its name only).
LEADER_ELECTION = "RoleBinding/rockbot-operator-leader-election"
LEADER_ELECTION_RIGHTS = expand("coordination.k8s.io", ["leases"], ["create", "get", "update"])
CRD_DISCOVERY = expand("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"])
NAMESPACE_DISCOVERY = expand("", ["namespaces"], ["list", "watch"])

# Exactly the verbs scripts_manager/backends/pods.py uses (test_scripts_manager_rbac.py checks this list
# against the requests of a real run).
SCRIPTS_MANAGER_RIGHTS = (
    expand("", ["pods"], ["create", "get", "list", "watch", "delete"])
    | expand("", ["pods/attach"], ["get", "create"])
    | expand("", ["pods/log"], ["get"])
    | expand("", ["events"], ["create"])  # a script pod that could not start
    | expand("networking.k8s.io", ["networkpolicies"], ["list", "watch"])  # a policy change: the canary again
    | expand("coordination.k8s.io", ["leases"], ["create", "get", "list", "update", "delete"])  # its own, others'
)

# Exactly what the gateway uses in the namespaces it watches (test_gateway_rbac.py checks this list against
# the requests of a real run).
GATEWAY_RIGHTS = (
    expand("rockbot.dev", ["triggers"], ["get", "list", "watch"])
    | expand("rockbot.dev", ["triggers/status"], ["patch"])
    | expand("rockbot.dev", ["agents"], ["list", "watch"])
    | expand("", ["events"], ["list", "watch"])
    | expand("", ["secrets"], ["get"])
)
#: The identities bound to any role: the four components that use the Kubernetes API (the console reviews
#: tokens and rights and reads Agents for its pages).
API_USERS = (OPERATOR_SA, SCRIPTS_MANAGER_SA, GATEWAY_SA, "rockbot-console")


def bindings(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")]


@pytest.mark.parametrize("name", COMBINATIONS)
def test_only_the_operator_the_scripts_manager_and_the_gateway_are_bound_to_any_role(render: Render, name: str) -> None:
    """Agent ServiceAccounts (made by the operator) and every other identity are bound to nothing."""
    for binding in bindings(render(COMBINATIONS[name])):
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", f"{binding['metadata']['name']} binds a {subject['kind']}"
            assert subject["namespace"] == NAMESPACE
            assert subject["name"] in API_USERS
            assert "agent" not in subject["name"]


def operator_grants(manifests: list[Manifest]) -> list[Grant]:
    """The operator's grants on objects, its leader election's aside."""
    return [grant for grant in grants_of(manifests, account=OPERATOR_SA) if grant.binding != LEADER_ELECTION]


@pytest.mark.parametrize("name", COMBINATIONS)
def test_the_operators_leader_election_reaches_its_own_lease_only(render: Render, name: str) -> None:
    manifests = render(COMBINATIONS[name])
    (grant,) = [grant for grant in grants_of(manifests, account=OPERATOR_SA) if grant.binding == LEADER_ELECTION]
    assert (grant.namespace, set(grant.rights)) == (NAMESPACE, LEADER_ELECTION_RIGHTS)
    named = named_rules(manifests, role="rockbot-operator-leader-election")
    assert named == {("coordination.k8s.io", "leases", verb): ["rockbot-operator"] for verb in ("get", "update")}
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "rockbot-operator"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["ROCKBOT_LEADER_LEASE"], env["ROCKBOT_LEADER_LEASE_NAMESPACE"]) == ("rockbot-operator", NAMESPACE)


@pytest.mark.parametrize("name", ["defaults", "agent-namespaces"])
def test_an_operator_watching_some_namespaces_has_rights_only_there(render: Render, name: str) -> None:
    values = COMBINATIONS[name]
    watched = [NAMESPACE, *values.get("agentNamespaces", [])]
    grants = operator_grants(render(values))
    cluster_wide = [grant for grant in grants if grant.namespace is None]
    assert [set(grant.rights) for grant in cluster_wide] == [CRD_DISCOVERY | NAMESPACE_DISCOVERY]
    assert sorted(grant.namespace for grant in grants if grant.namespace) == sorted(watched)
    for grant in grants:
        if grant.namespace:
            assert grant.binding.startswith("RoleBinding/")
            assert set(grant.rights) == OPERATOR_RIGHTS, grant.namespace
    for right in OPERATOR_RIGHTS:
        assert not allowed(grants, right=right, namespace="kube-system"), right
        assert not allowed(grants, right=right, namespace=None), right


def test_without_the_egress_canary_the_operator_has_no_pod_or_policy_rights(render: Render) -> None:
    grants = operator_grants(render({"agents": {"egressCanary": {"enabled": False}}}))
    assert [set(grant.rights) for grant in grants if grant.namespace] == [OPERATOR_RIGHTS - EGRESS_CANARY_RIGHTS]


def test_an_operator_watching_all_namespaces_has_its_rights_cluster_wide(render: Render) -> None:
    grants = operator_grants(render({"operator": {"watchAllNamespaces": True}}))
    assert all(grant.namespace is None for grant in grants)
    assert [set(grant.rights) for grant in grants] == [CRD_DISCOVERY, OPERATOR_RIGHTS]
    # kopf lists namespaces only to match a list of them, so watching all needs no namespace rights.
    assert not {right for grant in grants for right in grant.rights} & NAMESPACE_DISCOVERY


@pytest.mark.parametrize("name", COMBINATIONS)
def test_the_operator_deletes_nothing_but_scheduled_tasks(render: Render, name: str) -> None:
    """Children are removed by the garbage collector through owner references, never by the operator; it deletes
    only ScheduledTasks and its own egress canary pods, and updates only its leader Lease."""
    for grant in grants_of(render(COMBINATIONS[name]), account=OPERATOR_SA):
        deleting = {right for right in grant.rights if right[2] in ("delete", "deletecollection")}
        assert deleting <= {("rockbot.dev", "scheduledtasks", "delete"), ("", "pods", "delete")}, grant.binding
        updating = {right for right in grant.rights if right[2] in ("update", "escalate", "bind", "impersonate")}
        assert updating <= {("coordination.k8s.io", "leases", "update")}, grant.binding  # its Lease, by name


@pytest.mark.parametrize("name", ["defaults", "agent-namespaces", "everything", "gateway-off"])
def test_the_gateway_has_its_rights_only_where_the_operator_watches_and_writes_only_trigger_status(
    render: Render, name: str
) -> None:
    values = COMBINATIONS[name]
    grants = grants_of(render(values), account=GATEWAY_SA)
    if name == "gateway-off":
        assert grants == []
        return
    if values.get("operator", {}).get("watchAllNamespaces"):
        assert [(grant.namespace, set(grant.rights)) for grant in grants] == [(None, GATEWAY_RIGHTS)]
        return
    assert sorted(grant.namespace for grant in grants) == sorted([NAMESPACE, *values.get("agentNamespaces", [])])
    assert all(set(grant.rights) == GATEWAY_RIGHTS for grant in grants)
    assert not allowed(grants, right=("", "secrets", "list"), namespace=NAMESPACE)  # named Secrets only


@pytest.mark.parametrize(("name", "extra"), [("defaults", set()), ("agent-namespaces", set()),
                                             ("everything", {("", "pods", "patch")})])
def test_scripts_manager_rights_stop_at_the_scripts_namespace_but_for_reading_agents(
    render: Render, name: str, extra: set[Right]
) -> None:
    """Patch only with a warm pool (claims are patches); list/watch of Agents (their scriptLimits)
    where the operator watches, and nothing else outside the scripts namespace."""
    values = COMBINATIONS[name]
    grants = grants_of(render(values), account=SCRIPTS_MANAGER_SA)
    scripts = [grant for grant in grants if grant.namespace == "rockbot-scripts"]
    assert [set(grant.rights) for grant in scripts] == [SCRIPTS_MANAGER_RIGHTS | extra]
    agents = [grant for grant in grants if grant not in scripts]
    reading_agents = expand("rockbot.dev", ["agents"], ["list", "watch"])
    assert all(set(grant.rights) == reading_agents for grant in agents)
    if values.get("operator", {}).get("watchAllNamespaces"):
        assert [grant.namespace for grant in agents] == [None]
    else:
        assert sorted(grant.namespace for grant in agents) == sorted([NAMESPACE, *values.get("agentNamespaces", [])])


@pytest.mark.parametrize("name", COMBINATIONS)
def test_every_pod_complies_with_pod_security_restricted(
    render: Render, name: str, restricted_violations: Callable[[Manifest], list[str]]
) -> None:
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
            uses_api = spec["serviceAccountName"] in API_USERS
            assert spec["automountServiceAccountToken"] is uses_api, manifest["metadata"]["name"]


def test_the_scripts_namespace_enforces_restricted_as_the_suite_checks_it(render: Render) -> None:
    (namespace,) = [m for m in render() if m["kind"] == "Namespace" and m["metadata"]["name"] == "rockbot-scripts"]
    assert POD_SECURITY_RESTRICTED.items() <= namespace["metadata"]["labels"].items()


def pod_specs(manifest: Manifest) -> Iterator[dict]:
    """The pod specs inside a workload manifest (none for other kinds)."""
    kind, spec = manifest.get("kind"), manifest.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind == "StatefulSet":  # its controller adds a volume for each claim template to the pods
        claims = [{"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
                  for claim in spec.get("volumeClaimTemplates") or []]
        template = spec["template"]["spec"]
        yield {**template, "volumes": [*(template.get("volumes") or []), *claims]}
    elif kind in ("Deployment", "DaemonSet", "ReplicaSet", "Job"):
        yield spec["template"]["spec"]
    elif kind == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]
