"""The gateway's RBAC from evidence: run the real gateway against the API emulator through every path that
touches the API (loading and following Triggers and Agents, conditions, a webhook run recorded and completed,
Events watched and turned into a run) and check that the chart's rules allow every request it made, and
grant nothing it did not use.

The gateway logs in with the kubeconfig's token; the test's own client sends none.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest

from rockbot.kube import KubeClient
from tests.chart.conftest import Manifest
from tests.chart.rbac import GATEWAY_SA, Right, allowed, grants_of
from tests.chart.test_operator_rbac import operator_requests
from tests.fixtures.llm import Turn
from tests.gateway.conftest import NS, Cluster, StartGateway, cluster, send, start_gateway, triage  # noqa: F401
from tests.kubeapi import KubeApiEmulator

pytestmark = pytest.mark.slow  # runs go over a real RabbitMQ broker

Render = Callable[..., list[Manifest]]


async def test_every_request_the_gateway_makes_is_granted_by_the_chart(
    kube_client: KubeClient, kube_api: KubeApiEmulator, cluster: Cluster, triage, scripted_llm,  # noqa: F811
    start_gateway: StartGateway, render: Render,  # noqa: F811
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
    grants = grants_of(render({"agentNamespaces": [NS]}), account=GATEWAY_SA)
    refused = sorted(f"{u.right} in {u.namespace or 'the cluster'}" for u in used
                     if not allowed(grants, right=u.right, namespace=u.namespace))
    assert refused == [], "the gateway needs rights the chart does not grant"
    granted: set[Right] = set().union(*(grant.rights for grant in grants))
    assert sorted(granted - {u.right for u in used}) == [], "the chart grants rights the gateway never used"
    assert {u.namespace for u in used} == {NS}
