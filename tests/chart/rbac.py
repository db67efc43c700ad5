"""RBAC of the rendered chart: read from its manifests (what an identity is granted, where), and applied to the real
API server, whose authorizer answers, as each ServiceAccount with its own token, what that account may do."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import yaml

from tests.chart.conftest import NAMESPACE, Manifest
from tests.fixtures.kube_real import KubeCluster

Right = tuple[str, str, str]  # (apiGroup, resource, verb)

OPERATOR_SA = "rockbot-operator"
SCRIPTS_MANAGER_SA = "rockbot-scripts-manager"
GATEWAY_SA = "rockbot-gateway"


def rule_set(rules: list[dict]) -> set[Right]:
    """RBAC rules flattened to (apiGroup, resource, verb) triples, so equal rights compare equal (a rule limited
    to `resourceNames` counts as its triples: `named_rules` says which are)."""
    triples = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, f"unexpected rule fields: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    triples.add((group, resource, verb))
    return triples


def named_rules(manifests: list[Manifest], *, role: str) -> dict[Right, list[str]]:
    """The rights of the Role or ClusterRole `role` that only reach the objects it names, with those names."""
    (found,) = [m for m in manifests if m["kind"] in ("Role", "ClusterRole") and m["metadata"]["name"] == role]
    return {right: rule["resourceNames"] for rule in found["rules"] if "resourceNames" in rule
            for right in rule_set([{k: v for k, v in rule.items() if k != "resourceNames"}])}


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


@contextlib.contextmanager
def granted_on(cluster: KubeCluster, manifests: list[Manifest], *, account: str, namespace: str) -> Iterator[None]:
    """Apply the ServiceAccount `account` of `namespace` and the chart's (Cluster)Roles and bindings that name it
    to the real API server (their namespaces must exist); cluster-scoped ones get the namespace as a suffix
    (other runs share the cluster) and are deleted on exit."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    bindings = [m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")
                and subject in (m.get("subjects") or [])]
    wanted = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings}
    roles = [m for m in manifests if (m["kind"], m["metadata"]["name"]) in wanted]
    unique = f"-{namespace}"
    objects = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}}]
    for manifest in [*roles, *bindings]:
        manifest = copy.deepcopy(manifest)
        if manifest["kind"].startswith("Cluster"):
            manifest["metadata"]["name"] += unique
        if manifest.get("roleRef", {}).get("kind") == "ClusterRole":
            manifest["roleRef"]["name"] += unique
        objects.append(manifest)
    cluster_scoped = [o for o in objects if o["kind"].startswith("Cluster")]
    document = yaml.safe_dump_all(objects)
    try:
        cluster.kubectl("apply", "--server-side", "--field-manager=rockbot-tests", "-f", "-", input=document)
        yield
    finally:
        for manifest in cluster_scoped:
            cluster.kubectl("delete", manifest["kind"].lower(), manifest["metadata"]["name"], "--ignore-not-found",
                            "--wait=false", check=False)


def refused_by_the_api_server(
    cluster: KubeCluster, manifests: list[Manifest], *, account: str, namespace: str,
    rights: Iterable[tuple[Right, str | None]], within: float = 15.0, names: Mapping[Right, str] | None = None,
) -> list[str]:
    """Which of `rights` ((apiGroup, resource, verb), namespace or None) the real API server's RBAC refuses to the
    ServiceAccount, acting with its own token once the chart's RBAC for it is applied in `namespace`.

    `names`: the object a right was used on, for rights the chart grants by name only.
    Asked as the account itself (SelfSubjectAccessReview), so the answer is the authorizer's, not a copy of its
    rules. Bindings reach the authorizer a moment after they are written: a refusal is asked again until `within`.
    """
    with granted_on(cluster, manifests, account=account, namespace=namespace):
        token = cluster.token(namespace=namespace, service_account=account)
        deadline = time.monotonic() + within
        while True:
            refused = []
            for (group, resource, verb), where in sorted(rights, key=str):
                name, _, subresource = resource.partition("/")
                attributes = {"verb": verb, "group": group, "resource": name}
                if subresource:
                    attributes["subresource"] = subresource
                if where:
                    attributes["namespace"] = where
                if (group, resource, verb) in (names or {}):
                    attributes["name"] = (names or {})[(group, resource, verb)]
                status, review = cluster.request(
                    "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", token=token,
                    body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                          "spec": {"resourceAttributes": attributes}},
                )
                assert status == 201, f"SelfSubjectAccessReview as {account}: {status} {review}"
                if not review["status"]["allowed"]:
                    refused.append(f"{(group, resource, verb)} in {where or 'the cluster'}")
            if not refused or time.monotonic() > deadline:
                return refused
            time.sleep(0.5)
