"""Nothing is left behind: a deleted Agent's broker login, and after `helm uninstall` any pod or object."""

from __future__ import annotations

import pytest

from e2e.conftest import Json, Kubectl, Release, agent_manifest, until, wait_for_agent


def broker_users(kubectl: Kubectl, release: Release) -> set[str]:
    listed = kubectl.run("exec", "-n", release.namespace, f"{release.name}-rabbitmq-0", "--",
                         "rabbitmqctl", "list_users", "--quiet", "--no-table-headers")
    return {line.split("\t")[0] for line in listed.splitlines() if line.strip()}


def test_a_deleted_agent_loses_its_broker_login(kubectl: Kubectl, release: Release) -> None:
    name = "e2e-leaving"
    kubectl.apply(agent_manifest(name=name, model_url=release.model_url), namespace=release.namespace)
    wait_for_agent(kubectl, name=name, namespace=release.namespace)
    login = f"agent.{release.namespace}.{name}"
    assert login in broker_users(kubectl, release)

    kubectl.run("delete", "agent", name, "-n", release.namespace, "--timeout=120s", timeout=130)

    until(f"broker user {login} deleted", lambda: login not in broker_users(kubectl, release), within=60)
    until(f"the pods of Agent {name} gone", lambda: not kubectl.run(
        "get", "pods", "-n", release.namespace, "-o", "name",
        "-l", f"app.kubernetes.io/name=rockbot-agent,app.kubernetes.io/instance={name}"), within=120)


#: What every namespace has anyway (the control plane publishes its CAs into each).
EVERY_NAMESPACE = {("ConfigMap", "kube-root-ca.crt"), ("ConfigMap", "openshift-service-ca.crt"),
                   ("ServiceAccount", "default")}


def kept(item: Json) -> bool:
    """What every namespace has, and what the chart keeps on purpose: the Secrets marked
    `helm.sh/resource-policy: keep` (the broker's logins) and the broker's data volume (a StatefulSet's
    claims outlive it), so a reinstall finds the broker as it was."""
    metadata = item["metadata"]
    return (
        (item["kind"], metadata["name"]) in EVERY_NAMESPACE
        or (metadata.get("annotations") or {}).get("helm.sh/resource-policy") == "keep"
        or (item["kind"] == "PersistentVolumeClaim" and metadata["name"].startswith("data-"))
    )


@pytest.mark.uninstall
def test_helm_uninstall_leaves_nothing_behind(kubectl: Kubectl, release: Release) -> None:
    kubectl.run("delete", "agents,tools,scheduledtasks,triggers", "--all", "-n", release.namespace,
                "--timeout=180s", timeout=190)
    kubectl.run("delete", "secret", "e2e-hook-key", "-n", release.namespace, "--ignore-not-found")  # the test's own
    until("the release namespace without agent pods", lambda: {
        pod["metadata"]["labels"].get("app.kubernetes.io/name") for pod in release.pods()} <= {
        "rockbot"}, within=120)

    release.uninstall()

    until("no pod left in the release namespace", lambda: release.pods() == [], within=120)
    until(f"namespace {release.scripts_namespace} gone", lambda: not kubectl.run(
        "get", "namespace", release.scripts_namespace, "--ignore-not-found", "-o", "name"), within=120)
    left = kubectl.json("get", "all,secrets,configmaps,serviceaccounts,roles,rolebindings,networkpolicies,"
                        "persistentvolumeclaims", "-n", release.namespace)["items"]
    assert [f"{item['kind']}/{item['metadata']['name']}" for item in left if not kept(item)] == []
    cluster_wide = kubectl.run("get", "clusterroles,clusterrolebindings", "-o", "name",
                               "-l", f"app.kubernetes.io/instance={release.name}").split()
    assert cluster_wide == []
