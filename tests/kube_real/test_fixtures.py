"""The real-API-server fixtures do what their docstring promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rockbot.kube import NAMESPACES, KubeClient
from tests.fixtures.kube_real import KubeCluster


def test_the_crds_are_established(kube_cluster: KubeCluster) -> None:
    for plural in ("agents", "tools", "scheduledtasks", "triggers"):
        status, crd = kube_cluster.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                                  f"{plural}.rockbot.dev")
        assert status == 200, crd
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True", conditions


def test_each_test_gets_a_fresh_namespace_of_its_own(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    status, namespace = kube_cluster.request("GET", f"/api/v1/namespaces/{kube_namespace}")
    assert status == 200
    assert namespace["status"]["phase"] == "Active"
    for path in (f"/api/v1/namespaces/{kube_namespace}/secrets",
                 f"/apis/rockbot.dev/v1alpha1/namespaces/{kube_namespace}/agents"):
        status, listing = kube_cluster.request("GET", path)
        assert status == 200, (path, json.dumps(listing))
        assert listing["items"] == [], path


def test_a_service_account_token_acts_as_that_service_account(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    kube_cluster.kubectl("create", "serviceaccount", "reader", "-n", kube_namespace)
    token = kube_cluster.token(namespace=kube_namespace, service_account="reader")
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    status, answer = kube_cluster.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                          body=review, token=token)
    assert status == 201, answer
    assert answer["status"]["userInfo"]["username"] == f"system:serviceaccount:{kube_namespace}:reader"
    # RBAC applies to it: nothing is granted yet, so listing Secrets is forbidden.
    kubeconfig = kube_cluster.kubeconfig_for(token=token, path=tmp_path / "reader", namespace=kube_namespace)
    result = kube_cluster.kubectl("get", "secrets", kubeconfig=kubeconfig, check=False)
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower()


async def test_the_real_kube_client_talks_to_the_real_server(real_kube_client: KubeClient, kube_namespace: str) -> None:
    namespace = await real_kube_client.get(NAMESPACES, name=kube_namespace)
    assert namespace["metadata"]["uid"]


def test_a_dead_api_server_is_reported_with_its_address(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    config = kube_cluster.kubeconfig.read_text().replace(kube_cluster.server, "https://127.0.0.1:1")
    dead_config = tmp_path / "kubeconfig"
    dead_config.write_text(config)
    dead = KubeCluster(kubeconfig=dead_config, scratch=tmp_path / "certs", log=tmp_path / "apiserver.log",
                       private=True)
    problem = dead.problem()
    assert problem is not None
    assert "https://127.0.0.1:1 does not answer" in problem
    with pytest.raises(pytest.fail.Exception, match="does not answer"):
        dead.ensure_alive()


def test_a_dead_shared_rig_hands_the_session_to_a_control_plane_of_its_own(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    dead_config = tmp_path / "kubeconfig"
    dead_config.write_text(kube_cluster.kubeconfig.read_text().replace(kube_cluster.server, "https://127.0.0.1:1"))
    rig = KubeCluster(kubeconfig=dead_config, scratch=tmp_path / "certs", log=tmp_path / "apiserver.log",
                      private=False)
    moved: list[str] = []

    def fall_back(cluster: KubeCluster) -> None:  # stands for starting a control plane: the live server
        moved.append(cluster.server)
        cluster.connect(kubeconfig=kube_cluster.kubeconfig, scratch=tmp_path / "own", log=kube_cluster.log,
                        private=True)

    rig.fallback = fall_back
    rig.ensure_alive()  # no failure: the session moved on
    assert moved == ["https://127.0.0.1:1"]
    assert (rig.server, rig.private, rig.problem()) == (kube_cluster.server, True, None)
    assert rig.fallback is None  # once only: a second death fails the tests
