"""The operator's fixtures: the real API server as the test sees it and as the operator logs in to it, and the
chart's (a real helm, `render(values)`) for tests that start the operator as the chart deploys it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rockbot.kube import KubeClient
from tests.chart.conftest import helm, render
from tests.fixtures.kube_real import KubeCluster, point_clients_at
from tests.operator.kubelet import NO_NODE_LABEL, no_node_policy
from tests.pod_process import late_rabbitmq, pods

__all__ = ["helm", "late_rabbitmq", "pods", "render"]

#: Who the operator is on the real API server: the kubeconfig's static token (cluster admin, as the test is by
#: its client certificate), so the audit log tells the operator's requests from the test's and the controllers'.
OPERATOR_CONTEXT, OPERATOR_USER = "k8sreal-token", "static-admin"


@pytest.fixture(scope="session")
def pods_kept_off_nodes(kube_cluster: KubeCluster) -> str:
    """The label that keeps a namespace's pods off every node (see tests/operator/kubelet.py)."""
    for path, manifest in no_node_policy():
        status, answer = kube_cluster.request("PATCH", f"{path}?fieldManager=rockbot-tests&force=true", body=manifest,
                                              content_type="application/apply-patch+yaml")
        assert status in (200, 201), f"could not apply {path}: {status} {answer}"
    return NO_NODE_LABEL


@pytest.fixture
def kube(real_kube_client: KubeClient, kube_cluster: KubeCluster, kube_namespace: str,
         pods_kept_off_nodes: str) -> KubeClient:
    """The test's own client (the admin's certificate), in its own namespace (`kube_namespace`), whose pods no
    scheduler binds: no node runs the operator's children (the shared rig's would try to pull their image)."""
    status, answer = kube_cluster.request("PATCH", f"/api/v1/namespaces/{kube_namespace}",
                                          body={"metadata": {"labels": {pods_kept_off_nodes: "true"}}},
                                          content_type="application/merge-patch+json")
    assert status == 200, f"could not label namespace {kube_namespace}: {status} {answer}"
    return real_kube_client


@pytest.fixture
def operator_kubeconfig(kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path) -> str:
    """The text of a kubeconfig that acts as `OPERATOR_USER` in the test's namespace (for an operator process)."""
    config = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == OPERATOR_CONTEXT)
    token = next(u["user"]["token"] for u in config["users"] if u["name"] == context["user"])
    return kube_cluster.kubeconfig_for(token=token, path=tmp_path / "operator-kubeconfig",
                                       namespace=kube_namespace).read_text()


@pytest.fixture
def as_operator(kube: KubeClient, real_kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Clients made from now on (the operator's) log in as `OPERATOR_USER`; returns that user's name."""
    config = yaml.safe_load(real_kubeconfig.read_text())
    assert OPERATOR_CONTEXT in {context["name"] for context in config["contexts"]}, "the rig's kubeconfig changed"
    namespace = next(c["context"]["namespace"] for c in config["contexts"] if c["name"] == config["current-context"])
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    config["current-context"] = OPERATOR_CONTEXT
    path = tmp_path / "operator-context-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    point_clients_at(path, monkeypatch)
    return OPERATOR_USER
