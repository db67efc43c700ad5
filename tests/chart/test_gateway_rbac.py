"""The gateway's RBAC from evidence: run the real gateway against the API emulator through every path that
touches the API (loading and following Triggers and Agents, conditions, a webhook run recorded and completed,
Events watched and turned into a run) and check, on the real API server as the chart's gateway ServiceAccount
with its own token, that the chart's RBAC allows every request it made, and grants nothing it did not use.

The gateway logs in with the kubeconfig's token; the test's own client sends none.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Callable

import pytest

from rockbot.kube import NAMESPACES, KubeClient
from tests.chart.conftest import Manifest
from tests.chart.rbac import GATEWAY_SA, Right, grants_of, refused_by_the_api_server
from tests.chart.test_operator_rbac import operator_requests
from tests.fixtures.kube_real import KubeCluster
from tests.fixtures.kubeapi import client_for
from tests.fixtures.llm import Turn
from tests.gateway.conftest import NS, Cluster, StartGateway, send, start_gateway, triage  # noqa: F401
from tests.kubeapi import KubeApiEmulator

pytestmark = pytest.mark.slow  # runs go over a real RabbitMQ broker

Render = Callable[..., list[Manifest]]


@pytest.fixture
async def cluster(kube_api: KubeApiEmulator) -> AsyncIterator[Cluster]:
    """The agents' namespace on the emulator, which records each request with the token it carried."""
    async with client_for(kube_api) as kube:
        await kube.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield Cluster(kube, NS)


async def test_every_request_the_gateway_makes_is_granted_by_the_chart(
    kube_client: KubeClient, kube_api: KubeApiEmulator, cluster: Cluster, triage, scripted_llm,  # noqa: F811
    start_gateway: StartGateway, render: Render, kube_cluster: KubeCluster, kube_namespace: str,  # noqa: F811
) -> None:
    scripted_llm.play(Turn(text="Triaged."), Turn(text="Explained."))
    await cluster.agent()
    await cluster.secret()
    await cluster.trigger()
    await cluster.trigger("crashes", kubernetesEvents={"reason": "BackOff"})
    gateway = await start_gateway(kube=kube_client)
    await cluster.ready()
    assert (await send(gateway)).status == 202
    await cluster.event("web-1.17a9", count=1, at=datetime.datetime.now(datetime.UTC))
    await cluster.history(["Succeeded"])
    await cluster.history(["Succeeded"], name="crashes")
    used = operator_requests(kube_api)  # the requests that carried a token: the gateway's
    # The real API server judges, the gateway's ServiceAccount asking with its own token (the test's
    # namespace stands for the emulated agent namespace, and holds the release too).
    refused = refused_by_the_api_server(
        kube_cluster, render({"agentNamespaces": [kube_namespace]}, namespace=kube_namespace), account=GATEWAY_SA,
        namespace=kube_namespace, rights={(u.right, kube_namespace if u.namespace == NS else u.namespace)
                                          for u in used},
    )
    assert refused == [], "the gateway needs rights the chart does not grant"
    grants = grants_of(render({"agentNamespaces": [NS]}), account=GATEWAY_SA)
    granted: set[Right] = set().union(*(grant.rights for grant in grants))
    assert sorted(granted - {u.right for u in used}) == [], "the chart grants rights the gateway never used"
    assert {u.namespace for u in used} == {NS}
