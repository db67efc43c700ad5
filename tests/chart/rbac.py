"""Reading RBAC from rendered manifests as the API server's authorizer does: what an identity may do, where."""

from __future__ import annotations

from dataclasses import dataclass

from tests.chart.conftest import NAMESPACE, Manifest

Right = tuple[str, str, str]  # (apiGroup, resource, verb)

OPERATOR_SA = "rockbot-operator"
SCRIPTS_MANAGER_SA = "rockbot-scripts-manager"
GATEWAY_SA = "rockbot-gateway"


def rule_set(rules: list[dict]) -> set[Right]:
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


def expand(group: str, resources: list[str], verbs: list[str]) -> set[Right]:
    return {(group, resource, verb) for resource in resources for verb in verbs}


@dataclass(frozen=True)
class Grant:
    """Rights bound to an identity: in one namespace, or cluster-wide when `namespace` is None."""

    namespace: str | None
    rights: frozenset[Right]
    binding: str


def grants_of(manifests: list[Manifest], *, account: str, account_namespace: str = NAMESPACE) -> list[Grant]:
    """Every (Cluster)RoleBinding naming the ServiceAccount, with the rules of the role it refers to."""
    roles = {(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]): m
             for m in manifests if m["kind"] in ("Role", "ClusterRole")}
    found = []
    for binding in (m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = binding.get("subjects") or []
        if {"kind": "ServiceAccount", "name": account, "namespace": account_namespace} not in subjects:
            continue
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        found.append(Grant(namespace=scope, rights=frozenset(rule_set(role["rules"])),
                           binding=f"{binding['kind']}/{binding['metadata']['name']}"))
    return found


def allowed(grants: list[Grant], *, right: Right, namespace: str | None) -> bool:
    """Whether a request needing `right` in `namespace` (None: cluster-scoped or all namespaces) passes."""
    return any(right in grant.rights and grant.namespace in (None, namespace) for grant in grants)
