"""The egress canary of agent pods: one pod per namespace and policy shape, EgressRestricted on every Agent.

Every target is a listener this test starts on 127.0.0.1, never a real address. The fake node runs the
canary pod's command for real, with no network (a cluster that enforces the agents' policy) or on the
host's network (one that stores NetworkPolicies but does not enforce them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rockbot.kube import AGENTS, EVENTS, NETWORKPOLICIES, PODS, SERVICEACCOUNTS, KubeClient
from rockbot.operator import builders
from rockbot.operator.egress_canary import (
    CANARY_LABEL,
    NEVER_READY,
    SERVICE_ACCOUNT,
    canary_pod,
    selects,
    service_account,
    shape_of,
)
from rockbot.operator.settings import AGENT_FORBIDDEN, OperatorSettings
from rockbot.scripts_manager.canary import host_listeners
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import in_background
from tests.kubeapi.kubelet import FakeKubelet
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent, agent_body
from tests.operator.test_operator_e2e import create_basics
from tests.ports import free_port
from tests.waiting import eventually

NS = "default"
ENFORCE = "this cluster does not enforce NetworkPolicy"


def policy(name: str, selector: dict, types: list[str], version: str = "1") -> dict:
    return {"metadata": {"name": name, "resourceVersion": version},
            "spec": {"podSelector": selector, "policyTypes": types}}


def test_a_shape_is_the_egress_policies_that_select_the_pod() -> None:
    labels = builders.labels(agent("analyst"))
    chart = policy("rockbot-agent-egress", {"matchLabels": {"app.kubernetes.io/name": "rockbot-agent"}}, ["Egress"])
    only_bob = policy("bob", {"matchLabels": {"app.kubernetes.io/instance": "bob"}}, ["Egress"])
    ingress = policy("ingress-only", {}, ["Ingress"])
    not_bob = policy("not-bob", {"matchExpressions": [
        {"key": "app.kubernetes.io/instance", "operator": "NotIn", "values": ["bob"]},
        {"key": "app.kubernetes.io/component", "operator": "Exists"}]}, ["Ingress", "Egress"])
    policies = [chart, only_bob, ingress, not_bob]
    assert shape_of(labels, policies) == (("not-bob", "1"), ("rockbot-agent-egress", "1"))
    assert shape_of(builders.labels(agent("bob")), policies) == (("bob", "1"), ("rockbot-agent-egress", "1"))
    assert shape_of(builders.labels(agent("carol")), policies) == shape_of(labels, policies)  # one canary for both
    assert not selects({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, {"x": "1"})
    assert selects({}, labels)


def test_the_canary_pod_is_restricted_like_an_agents_and_never_serves_its_service(restricted_violations) -> None:
    """The real admission judges it, as it does an agent's pod."""
    labels = builders.labels(agent("analyst"))
    pod = canary_pod(namespace=NS, shape=(("p", "1"),), labels=labels, image="img", targets=AGENT_FORBIDDEN)
    assert restricted_violations(pod) == []
    assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT and pod["spec"]["containers"][0]["image"] == "img"
    account = service_account(NS, builders.owner_reference(agent("analyst")))
    assert account["automountServiceAccountToken"] is False  # no token, on the account and the pod
    [owner] = account["metadata"]["ownerReferences"]  # it goes with its Agent: helm uninstall leaves nothing
    assert owner["kind"] == "Agent" and owner["controller"] is False
    assert pod["metadata"]["labels"] == {**labels, CANARY_LABEL: "egress"}
    assert "pod-template-hash" not in pod["metadata"]["labels"]  # no ReplicaSet adopts it
    assert pod["spec"]["readinessGates"] == [{"conditionType": NEVER_READY}]  # never Ready: never an endpoint
    assert pod["spec"]["automountServiceAccountToken"] is False and pod["spec"]["activeDeadlineSeconds"] <= 120
    again = canary_pod(namespace=NS, shape=(("p", "1"),), labels=labels, image="img", targets=AGENT_FORBIDDEN)
    assert again["metadata"]["name"] == pod["metadata"]["name"]  # one name per shape: a leftover is replaced


@contextlib.asynccontextmanager
async def node(kube_api: KubeApiEmulator, kube: KubeClient, *, network: bool) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(emulator=kube_api, kube=kube, namespace=NS, network=network)
    async with in_background(kubelet):
        yield kubelet


async def egress_of(kube: KubeClient, name: str, status: str) -> dict:
    async def settled() -> dict:
        found = condition(await kube.get(AGENTS, namespace=NS, name=name), "EgressRestricted")
        assert found["status"] == status, found
        return found

    return await eventually(settled, within=60)


async def test_agents_on_a_network_that_ignores_policies_show_egress_not_restricted_naming_the_target(
    kube_client: KubeClient, kube_api: KubeApiEmulator
) -> None:
    await create_basics(kube_client)
    await kube_client.create(NETWORKPOLICIES, namespace=NS, body={
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "rockbot-agent-egress"},
        "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rockbot-agent"}},
                 "policyTypes": ["Egress"]}})  # fmt: skip
    for name in ("analyst", "writer"):
        await kube_client.create(AGENTS, namespace=NS, body=agent_body(name))
    async with host_listeners() as targets, node(kube_api, kube_client, network=True) as kubelet:
        settings = canary_settings(targets["host"])
        port = free_port()
        async with operator_running(settings, health_endpoint=f"http://127.0.0.1:{port}/healthz"):
            analyst = await egress_of(kube_client, "analyst", "False")
            writer = await egress_of(kube_client, "writer", "False")
            metrics = await scrape(port)
    tcp, dns = targets["host"]
    assert sample(metrics, "rockbot_isolation_reachable", target=tcp) == 1
    assert sample(metrics, "rockbot_isolation_reachable", target=dns) == 1
    assert sample(metrics, "rockbot_isolation_last_proof_timestamp_seconds") == 0  # never isolated
    pod = kubelet.seen[0]
    assert pod["spec"]["serviceAccountName"] == SERVICE_ACCOUNT and pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["containers"][0]["image"] == settings.agent_image
    account = await kube_client.get(SERVICEACCOUNTS, namespace=NS, name=SERVICE_ACCOUNT)
    assert account["automountServiceAccountToken"] is False
    assert analyst["reason"] == "TargetsReached"
    assert analyst["message"].startswith(f"agent pods reached outside ({tcp}), outside ({dns}) in its last run: ")
    assert ENFORCE in analyst["message"] and writer["message"] == analyst["message"]
    assert len(kubelet.seen) == 1, "one canary for both Agents: one namespace, one policy shape"
    assert not (await kube_client.list(PODS, namespace=NS, label_selector=CANARY_LABEL)).items  # cleaned up
    warnings = [e for e in (await kube_client.list(EVENTS, namespace=NS)).items if e["reason"] == "TargetsReached"]
    assert {e["involvedObject"]["name"] for e in warnings} == {"analyst", "writer"}


async def test_agents_whose_canary_reaches_nothing_show_egress_restricted(
    kube_client: KubeClient, kube_api: KubeApiEmulator
) -> None:
    await create_basics(kube_client)
    await kube_client.create(AGENTS, namespace=NS, body=agent_body("analyst"))
    async with host_listeners() as targets, node(kube_api, kube_client, network=False) as kubelet:
        settings = canary_settings(targets["host"])
        port = free_port()
        async with operator_running(settings, health_endpoint=f"http://127.0.0.1:{port}/healthz"):
            found = await egress_of(kube_client, "analyst", "True")
            metrics = await scrape(port)
        assert {sample(metrics, "rockbot_isolation_reachable", target=target) for target in targets["host"]} == {0}
        assert sample(metrics, "rockbot_isolation_last_proof_timestamp_seconds") > 0
        mark = len(kube_api.requests)
        async with operator_running(settings):  # a restart: a new proof, the same finding, so nothing to write

            async def proven_again() -> None:
                assert len(kubelet.seen) == 2, "the restarted operator's canary has not run yet"
                assert not (await kube_client.list(PODS, namespace=NS, label_selector=CANARY_LABEL)).items

            await eventually(proven_again, within=60)
            await eventually(lambda: _idle(kube_api, since=mark))
    status_writes = [r for r in kube_api.requests[mark:] if r.url.path.endswith("/agents/analyst/status")]
    assert status_writes == [], "a restart rewrote EgressRestricted"
    assert condition(await kube_client.get(AGENTS, namespace=NS, name="analyst"), "EgressRestricted") == found
    assert found["reason"] == "NothingReached"
    assert found["message"] == f"agent pods reached none of outside ({targets['host'][0]}), outside " \
        f"({targets['host'][1]}) in its last run"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sample(metrics: Samples, name: str, **labels: str) -> float:
    return metrics[(name, frozenset({"scope": "agents", "namespace": NS, **labels}.items()))]


async def scrape(port: int) -> Samples:
    """The operator's /metrics, as Prometheus reads them: (name, label values) -> value."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as answer:
        text = await answer.text()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


async def _idle(kube_api: KubeApiEmulator, *, since: int) -> None:
    """The operator's reconciles after the canary's proof are done: its last request was a while ago."""
    count = len(kube_api.requests)
    await asyncio.sleep(0.5)
    assert len(kube_api.requests) == count, "the operator is still working"


async def test_agents_added_while_and_after_their_canary_runs_share_its_proof_at_a_cost_linear_in_their_number(
    kube_client: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """Each Agent asks for its namespace's proof at its first reconcile: those that ask while the canary runs get its
    proof when it ends, those that ask after get the proof that holds, and each costs its own status, not a look at
    every Agent of the namespace again (N Agents made N x N reconciles)."""
    await create_basics(kube_client)
    early, late = [f"early-{n}" for n in range(6)], [f"late-{n}" for n in range(6)]
    for name in early:
        await kube_client.create(AGENTS, namespace=NS, body=agent_body(name))
    async with host_listeners() as targets, node(kube_api, kube_client, network=False) as kubelet:
        settings = canary_settings(targets["host"])
        port = free_port()
        async with operator_running(settings, health_endpoint=f"http://127.0.0.1:{port}/healthz"):
            for name in early:
                await egress_of(kube_client, name, "True")
            for name in late:
                await kube_client.create(AGENTS, namespace=NS, body=agent_body(name))
            for name in late:
                await egress_of(kube_client, name, "True")
            mark = len(kube_api.requests)
            await eventually(lambda: _idle(kube_api, since=mark))
            metrics = await scrape(port)
    assert len(kubelet.seen) == 1, "one canary for every Agent: one namespace, one policy shape"
    status_only = metrics[("rockbot_operator_agent_reconciles_total", frozenset({("work", "status")}))]
    assert status_only <= 3 * len(early + late)


def canary_settings(outside: str) -> OperatorSettings:
    """The operator of NS alone, with its egress canary trying `outside` (a listener of the test's host)."""
    return OperatorSettings(namespaces=[NS], agent_image="registry.example/rockbot:test", resync_seconds=3600,
                            egress_canary=True, egress_canary_targets={"outside": outside})
