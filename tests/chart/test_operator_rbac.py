"""The operator's RBAC from evidence: run the real operator against the API emulator, through every path
that touches the API (reconcile, repair, Tool fan-out, status, events, the scheduler, the agents'
scheduling requests), and check on the real API server, acting as the chart's operator ServiceAccount
with its own token, that every request it made is allowed by the chart's RBAC.

The operator's requests are told apart from the test's own by identity, as RBAC does: the operator
logs in with the kubeconfig's token, the test's client sends none.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from rockbot.bus import OPERATOR, AccessRefused, AmqpBus
from rockbot.bus.admin import AGENT_TAG
from rockbot.bus.topology import OPERATOR_SCHEDULING, agent_replies
from rockbot.contracts.scheduling import CancelTask, ListTasks, ScheduleTask, SchedulingReply, SchedulingRequest
from rockbot.kube import (
    AGENTS,
    CONFIGMAPS,
    DEPLOYMENTS,
    EVALUATIONS,
    SCHEDULED_TASKS,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    TOOLS,
    KubeClient,
    NotFound,
    Resource,
)
from rockbot.operator.settings import OperatorSettings
from rockbot.scripts_manager.canary import host_listeners
from tests.chart.conftest import Manifest
from tests.chart.rbac import OPERATOR_SA, Right, grants_of, refused_by_the_api_server
from tests.fixtures.kube_real import KubeCluster
from tests.fixtures.kubeapi import client_for
from tests.fixtures.rabbitmq import Vhost
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import in_background
from tests.kubeapi.kubelet import FakeKubelet
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body, tool_body
from tests.operator.test_bus_identities import bus_url, settings_for
from tests.scheduling.conftest import FakeAgent
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # the operator's scheduling talks over a real RabbitMQ broker

NS = "default"
#: The chart's leader Lease (its get and update are granted on it by name only).
LEASE = "rockbot-operator"
Render = Callable[..., list[Manifest]]


@dataclass(frozen=True)
class Used:
    """One request the operator made, as RBAC sees it: the right it needs and where."""

    right: Right
    namespace: str | None


def used_right(request: Any) -> Used | None:
    """The (apiGroup, resource, verb) a request needs, or None for discovery (allowed to everyone)."""
    parts = [part for part in request.url.path.split("/") if part]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], (rest[1:2] or [None])[0], rest[2:3]
    if sub:
        resource = f"{resource}/{sub[0]}"
    method = str(request.method.value).upper()
    if method == "GET":
        watching = str(request.params.get("watch", "")).lower() in ("true", "1")
        verb = "watch" if watching else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method) or (
            "delete" if name else "deletecollection")
    return Used(right=(group, resource, verb), namespace=namespace)


def operator_requests(emulator: KubeApiEmulator) -> set[Used]:
    return {
        used
        for request in emulator.requests
        if request.headers.get("Authorization", "").startswith("Bearer ")
        and (used := used_right(request)) is not None
    }


async def provisioned(vhost: Vhost, user: str) -> None:
    assert user in await vhost.admin.users(tag=AGENT_TAG)


async def logged_in(kube: KubeClient, agent: str, *, within: float = 30.0) -> AmqpBus:
    """The agent's connection with the login in its bus Secret, once that login works: the Secret can
    appear before the broker accepts its password."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await AmqpBus.connect(url=await bus_url(kube, NS, agent))
        except (AccessRefused, NotFound) as exc:
            if asyncio.get_running_loop().time() > deadline:
                message = f"the login in {agent}'s bus Secret did not work within {within:g} s: {exc}"
                raise AssertionError(message) from exc
            await asyncio.sleep(0.2)


def secret(name: str, **data: str) -> dict:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


async def ask(
    bus: AmqpBus, kube: KubeClient, agent: str, operation: ScheduleTask | ListTasks | CancelTask
) -> SchedulingReply:
    """As the agent's tools ask, signed with the token the operator generated for it."""
    replies = agent_replies(namespace=NS, name=agent, slot=0)
    token_secret = await kube.get(SECRETS, namespace=NS, name=f"rockbot-{agent}-http-token")
    correlation_id = secrets.token_hex(8)
    request = SchedulingRequest.signed(
        token=base64.b64decode(token_secret["data"]["token"]).decode(), agent=f"{NS}/{agent}", operation=operation,
        correlation_id=correlation_id, reply_to=replies.name, issued_at=datetime.datetime.now(datetime.UTC),
    )
    delivery = await bus.request(
        queue=OPERATOR_SCHEDULING, body=request, reply_queue=replies, correlation_id=correlation_id,
        timeout_seconds=15, responder=OPERATOR,
    )
    reply = delivery.decode(SchedulingReply)
    assert reply.error is None, reply.error
    return reply


def unlabelled_children(agent: str) -> list[tuple[Resource, dict[str, Any]]]:
    """An Agent's four watched children as a person might have made them: same names, no labels, no owner."""
    labels = {"app.kubernetes.io/name": "rockbot-agent", "app.kubernetes.io/instance": agent}  # (immutable)
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    return [
        (SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": f"rockbot-{agent}"}}),
        (CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"rockbot-{agent}-config"}}),
        (SERVICES, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"rockbot-{agent}"},
                    "spec": {"selector": labels, "ports": [{"port": 80}]}}),
        (DEPLOYMENTS, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"rockbot-{agent}"},
                       "spec": {"selector": {"matchLabels": labels}, "template": template}}),
    ]


async def exercise_the_operator(
    *, kube: KubeClient, kube_api: KubeApiEmulator, vhost: Vhost, namespaces: list[str]
) -> None:
    """Every path of the operator that talks to the API, once (the egress canary on a node of its own too)."""
    async with host_listeners() as targets, in_background(FakeKubelet(emulator=kube_api, kube=kube, namespace=NS)):
        settings = settings_for(vhost, NS).model_copy(update={
            "namespaces": namespaces, "egress_canary": True, "egress_canary_targets": {"outside": targets["host"]},
            "leader_lease": LEASE, "leader_lease_namespace": NS})
        await _exercise(kube=kube, vhost=vhost, settings=settings)


async def _exercise(*, kube: KubeClient, vhost: Vhost, settings: OperatorSettings) -> None:
    await kube.create(SECRETS, namespace=NS, body=secret("llm", apiKey="sk-test"))
    await kube.create(TOOLS, namespace=NS, body=tool_body("weather"))
    await kube.create(AGENTS, namespace=NS, body=agent_body(tools=["weather"], builtinTools=["scheduling"]))
    # Children someone made without the operator's label: its watches do not show them, its creates
    # are refused (409), so it reads them, and adopts them (no controller owns them).
    for resource, body in unlabelled_children("adopted"):
        await kube.create(resource, namespace=NS, body=body)
    await kube.create(AGENTS, namespace=NS, body=agent_body("adopted"))
    async with operator_running(settings):
        # The analyst's pods log in with the Secret the operator made for it, once its user exists.
        await eventually(lambda: provisioned(vhost, f"agent.{NS}.analyst"), within=30)
        bus = await logged_in(kube, "analyst")
        inbox = await FakeAgent(bus=bus, namespace=NS, name="analyst").start()
        try:
            deployment = await eventually(lambda: kube.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst"))
            replicas = deployment["spec"]["replicas"]
            await kube.patch(DEPLOYMENTS, namespace=NS, name="rockbot-analyst", subresource="status", body={
                "status": {"observedGeneration": deployment["metadata"]["generation"], "replicas": replicas,
                           "updatedReplicas": replicas, "readyReplicas": replicas}})

            async def ready() -> None:
                agent = await kube.get(AGENTS, namespace=NS, name="analyst")
                assert condition(agent, "Ready")["status"] == "True"
                assert condition(agent, "EgressRestricted")["status"] == "True"

            await eventually(ready)

            async def adopted() -> None:
                for resource, body in unlabelled_children("adopted"):
                    child = await kube.get(resource, namespace=NS, name=body["metadata"]["name"])
                    assert [ref["name"] for ref in child["metadata"].get("ownerReferences", [])] == ["adopted"]

            await eventually(adopted)
            # Drift repair (children deleted or edited by hand) and a Tool change fanning out to its Agent.
            await kube.delete(CONFIGMAPS, namespace=NS, name="rockbot-analyst-config")
            await kube.patch(SERVICEACCOUNTS, namespace=NS, name="rockbot-analyst",
                             body={"automountServiceAccountToken": True})
            await kube.patch(SERVICES, namespace=NS, name="rockbot-analyst",
                             body={"metadata": {"labels": {"app.kubernetes.io/name": "edited"}}})
            await kube.patch(TOOLS, namespace=NS, name="weather", body={"spec": {"description": "Forecasts."}})

            async def repaired() -> None:
                config = await kube.get(CONFIGMAPS, namespace=NS, name="rockbot-analyst-config")
                assert "Forecasts." in config["data"]["agent.json"]
                account = await kube.get(SERVICEACCOUNTS, namespace=NS, name="rockbot-analyst")
                assert account["automountServiceAccountToken"] is False
                service = await kube.get(SERVICES, namespace=NS, name="rockbot-analyst")
                assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "rockbot-agent"

            await eventually(repaired)
            # The agent's scheduling tools: create, replace, list, cancel; then a task that fires.
            await ask(bus, kube, "analyst", ScheduleTask(name="digest", cron="0 18 * * *", prompt="Send the digest."))
            await ask(bus, kube, "analyst", ScheduleTask(name="digest", cron="0 19 * * *", prompt="Send the digest."))
            await ask(bus, kube, "analyst", ListTasks())
            await ask(bus, kube, "analyst", CancelTask(name="digest"))
            await ask(bus, kube, "analyst", ScheduleTask(name="tick", cron="* * * * * *", prompt="Tick."))

            async def fired() -> None:
                tasks = (await kube.list(SCHEDULED_TASKS, namespace=NS)).items
                assert any((task.get("status") or {}).get("history") for task in tasks)

            await eventually(fired, within=20)
            # An Evaluation of the analyst: its case crosses the broker, its result is written to its status.
            await kube.create(EVALUATIONS, namespace=NS, body={
                "apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": "basics"},
                "spec": {"agentRef": {"name": "analyst"}, "cases": [
                    {"name": "answers", "input": "Anything?", "expect": {"contains": ["done"]}}]}})

            async def evaluated() -> None:
                evaluation = await kube.get(EVALUATIONS, namespace=NS, name="basics")
                assert (evaluation.get("status") or {}).get("score") == 1.0, evaluation.get("status")

            await eventually(evaluated, within=20)
        finally:
            await inbox.stop()
            await bus.close()


@pytest.mark.parametrize("watch_all", [False, True], ids=["release-namespaces", "all-namespaces"])
async def test_every_request_the_operator_makes_is_granted_by_the_chart(
    kube_api: KubeApiEmulator, kubeconfig: Any, vhost: Vhost, render: Render, watch_all: bool,
    kube_cluster: KubeCluster, kube_namespace: str,
) -> None:
    async with client_for(kube_api) as kube:
        await exercise_the_operator(kube=kube, kube_api=kube_api, vhost=vhost, namespaces=[] if watch_all else [NS])
    used = operator_requests(kube_api)
    leases = {request.url.path.rsplit("/", 1)[1] for request in kube_api.requests
              if request.headers.get("Authorization", "").startswith("Bearer ") and "/leases/" in request.url.path}
    assert leases == {LEASE}, "the operator read or wrote a Lease other than its own"
    # The real API server judges: the chart's RBAC applied, the operator's ServiceAccount asks with its token
    # for each right it used (in the test's namespace, standing for the emulated release namespace).
    values = {"operator": {"watchAllNamespaces": watch_all}}
    refused = refused_by_the_api_server(
        kube_cluster, render(values, namespace=kube_namespace), account=OPERATOR_SA, namespace=kube_namespace,
        rights={(u.right, kube_namespace if u.namespace == NS else u.namespace) for u in used},
        names={u.right: LEASE for u in used if u.right[1] == "leases" and u.right[2] != "create"},
    )
    assert refused == [], "the operator needs rights the chart does not grant"
    grants = grants_of(render(values, namespace=NS), account=OPERATOR_SA, account_namespace=NS)
    granted = set().union(*(grant.rights for grant in grants))
    assert sorted(granted - {u.right for u in used}) == [], "the chart grants rights the operator never used"


def test_the_api_server_refuses_the_operator_what_the_chart_does_not_grant(
    render: Render, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    granted = (("rockbot.dev", "agents", "watch"), kube_namespace)
    not_granted = [(("", "secrets", "deletecollection"), kube_namespace), (("", "nodes", "get"), None),
                   (("rockbot.dev", "agents", "watch"), "kube-system")]
    refused = refused_by_the_api_server(
        kube_cluster, render(namespace=kube_namespace), account=OPERATOR_SA, namespace=kube_namespace,
        rights={granted, *not_granted}, within=5.0,
    )
    assert refused == sorted(f"{right} in {where or 'the cluster'}" for right, where in not_granted)
