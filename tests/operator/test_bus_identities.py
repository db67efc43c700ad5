"""The operator gives every Agent its own broker login, inbox and permissions, and takes them away with the Agent:
the real operator against the real API server and the real broker's management API."""

from __future__ import annotations

import asyncio
import base64
import logging

import pytest

from rockbot.bus import CONSOLE, GATEWAY, OPERATOR, SCRIPTS_MANAGER, AccessRefused, AmqpBus, Delivery, Principal
from rockbot.bus.admin import AGENT_TAG, SERVICE_TAG
from rockbot.bus.topology import agent_inbox, agent_replies
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.kube import AGENTS, DEPLOYMENTS, SECRETS, KubeClient, NotFound
from rockbot.operator.settings import OperatorSettings
from tests.fixtures.kube_real import KubeCluster
from tests.fixtures.rabbitmq import Vhost
from tests.operator.audit import AuditLog
from tests.operator.harness import operator_running
from tests.operator.kubelet import pods_ready
from tests.operator.samples import agent_body
from tests.operator.test_operator_e2e import is_ready, secret
from tests.waiting import eventually


def settings_for(vhost: Vhost, ns: str, *, resync_seconds: float = 3600) -> OperatorSettings:
    """The operator as the chart configures it: its own login, the scripts-manager's, the gateway's, and the admin's
    API."""
    return OperatorSettings(
        namespaces=[ns], resync_seconds=resync_seconds,
        amqp_url=vhost.url_of(OPERATOR), scripts_manager_amqp_url=vhost.url_of(SCRIPTS_MANAGER),
        gateway_amqp_url=vhost.url_of(GATEWAY), console_amqp_url=vhost.url_of(CONSOLE),
        broker_management_url=vhost.broker.management_url, broker_admin_username="guest",
        broker_admin_password="guest",
    )  # fmt: skip


async def bus_url(kube: KubeClient, ns: str, agent: str) -> str:
    """What the agent's pods get: the URL in its own bus Secret."""
    data = (await kube.get(SECRETS, namespace=ns, name=f"rockbot-{agent}-bus"))["data"]
    return base64.b64decode(data["amqp-url"]).decode()


async def users(vhost: Vhost) -> set[str]:
    return await vhost.admin.users(tag=AGENT_TAG) | await vhost.admin.users(tag=SERVICE_TAG)


async def test_every_agent_gets_its_own_login_inbox_and_permissions_and_loses_them_with_the_agent(
    kube: KubeClient, kube_namespace: str, as_operator: str, vhost: Vhost
) -> None:
    ns = kube_namespace
    LEAD, RESEARCHER = Principal.agent(namespace=ns, name="lead"), Principal.agent(namespace=ns, name="researcher")
    await kube.create(SECRETS, namespace=ns, body=secret("llm", apiKey="sk-test"))
    await kube.create(AGENTS, namespace=ns, body=agent_body("researcher", namespace=ns))
    await kube.create(AGENTS, namespace=ns, body=agent_body("lead", namespace=ns, subAgents=[{"name": "researcher"}]))
    async with operator_running(settings_for(vhost, ns)):
        async def provisioned() -> None:
            assert {LEAD.user, RESEARCHER.user, OPERATOR.user, SCRIPTS_MANAGER.user, GATEWAY.user,
                    CONSOLE.user} <= await users(vhost)
            queues = await asyncio.to_thread(vhost.queues)
            assert {agent_inbox(namespace=ns, name=name).name for name in ("lead", "researcher")} <= set(queues)

        await eventually(provisioned, within=30)
        deployment = await eventually(lambda: kube.get(DEPLOYMENTS, namespace=ns, name="rockbot-lead"), within=30)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {item["name"]: item.get("valueFrom") for item in container["env"]}
        assert env["ROCKBOT_AMQP_URL"] == {"secretKeyRef": {"name": "rockbot-lead-bus", "key": "amqp-url"}}
        lead_url, researcher_url = await bus_url(kube, ns, "lead"), await bus_url(kube, ns, "researcher")
        assert lead_url.startswith(f"amqp://{LEAD.user}:") and lead_url != researcher_url

        async with await AmqpBus.connect(url=lead_url) as lead, await AmqpBus.connect(url=researcher_url) as researcher:
            assert (lead.user, researcher.user) == (LEAD.user, RESEARCHER.user)

            async def answer(delivery: Delivery) -> None:
                request = delivery.decode(InboxRequest)
                await researcher.reply(to=delivery, body=InboxReply(
                    request_id=request.request_id, session_id=request.session_id, answer="Lima."))

            await researcher.consume(queue=agent_inbox(namespace=ns, name="researcher"), handler=answer)
            request = InboxRequest(kind="agent_call", request_id="r1", session_id="s", content="Capital of Peru?",
                                   call_chain=(f"{ns}/lead",))
            reply = await lead.request(
                queue=agent_inbox(namespace=ns, name="researcher"), body=request, correlation_id="r1",
                reply_queue=agent_replies(namespace=ns, name="lead", slot=0), timeout_seconds=15,
                responder=RESEARCHER,
            )  # fmt: skip
            assert reply.decode(InboxReply).answer == "Lima."
            with pytest.raises(AccessRefused):  # the researcher calls nobody: not even its caller's inbox
                await researcher.publish(queue=agent_inbox(namespace=ns, name="lead"), body=request)

        await kube.delete(AGENTS, namespace=ns, name="researcher")

        async def forgotten() -> None:
            assert RESEARCHER.user not in await users(vhost)
            assert agent_inbox(namespace=ns, name="researcher").name not in await asyncio.to_thread(vhost.queues)

        await eventually(forgotten, within=30)
        assert LEAD.user in await users(vhost)


async def test_an_agent_no_longer_called_can_no_longer_answer_its_former_caller(
    kube: KubeClient, kube_namespace: str, as_operator: str, vhost: Vhost
) -> None:
    """Who may answer whom follows the Agents' calls both ways: the callee of a caller that stops calling it loses
    the right to write to that caller's reply slots (the operator keeps who calls each agent as an index)."""
    ns = kube_namespace
    await kube.create(SECRETS, namespace=ns, body=secret("llm", apiKey="sk-test"))
    await kube.create(AGENTS, namespace=ns, body=agent_body("researcher", namespace=ns))
    await kube.create(AGENTS, namespace=ns, body=agent_body("lead", namespace=ns, subAgents=[{"name": "researcher"}]))
    answer = InboxReply(request_id="r1", session_id="s", answer="Lima.")
    async with operator_running(settings_for(vhost, ns)):
        url = await eventually(lambda: bus_url(kube, ns, "researcher"), within=30)

        async def answers_lead() -> None:
            async with await AmqpBus.connect(url=url) as researcher:
                await researcher.publish(queue=agent_replies(namespace=ns, name="lead", slot=0), body=answer)

        async def allowed() -> None:
            try:
                await answers_lead()
            except AccessRefused as error:  # its login does not work until its user is complete
                raise AssertionError(str(error)) from error

        await eventually(allowed, within=30)
        await kube.patch(AGENTS, namespace=ns, name="lead", body={"spec": {"subAgents": None}})  # calls nobody now

        async def refused() -> None:
            try:
                await answers_lead()
            except AccessRefused:
                return
            raise AssertionError("the researcher may still write to the lead's reply slots")

        await eventually(refused, within=30)


async def test_a_settled_agent_costs_no_write_to_the_api_or_the_broker(
    kube: KubeClient, kube_namespace: str, kube_cluster: KubeCluster, as_operator: str, vhost: Vhost,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = kube_namespace
    caplog.set_level(logging.INFO, logger="rockbot.operator.broker")
    await kube.create(SECRETS, namespace=ns, body=secret("llm", apiKey="sk-test"))
    await kube.create(AGENTS, namespace=ns, body=agent_body("lead", namespace=ns))
    async with operator_running(settings_for(vhost, ns, resync_seconds=0.5)), pods_ready(kube, ns):
        await eventually(lambda: is_ready(kube, ns, "lead"), within=60)

        async def two_resyncs_without_a_write() -> None:
            """Settled: two full resyncs (each reads the agent's bus Secret) write nothing, anywhere."""
            audit = AuditLog(kube_cluster.kubeconfig.parent / "logs" / "audit.log", namespace=ns)
            logged = len(caplog.records)

            async def resynced_twice() -> None:
                reads = [e for e in audit.read() if e.user == as_operator and e.verb == "get"
                         and e.resource == "secrets" and e.name == "rockbot-lead-bus"]
                assert len(reads) >= 2

            await eventually(resynced_twice, within=30)
            assert [f"{e.verb} {e.resource} {e.name}" for e in audit.read() if e.user == as_operator and e.write] == []
            assert [r.getMessage() for r in caplog.records[logged:] if r.name == "rockbot.operator.broker"] == []

        await eventually(two_resyncs_without_a_write, within=60)


async def test_the_users_of_agents_deleted_while_the_operator_was_down_are_swept_at_start(
    kube: KubeClient, kube_namespace: str, as_operator: str, vhost: Vhost
) -> None:
    ns = kube_namespace
    ghost = Principal.agent(namespace=ns, name="ghost")
    elsewhere = Principal.agent(namespace="other-team", name="ghost")  # not this operator's namespace
    await vhost.url(ghost)
    await vhost.url(elsewhere)
    async with operator_running(settings_for(vhost, ns)):
        async def swept() -> None:
            assert ghost.user not in await users(vhost)
            assert agent_inbox(namespace=ns, name="ghost").name not in await asyncio.to_thread(vhost.queues)

        await eventually(swept, within=30)
    assert elsewhere.user in await users(vhost)
    with pytest.raises(NotFound):
        await kube.get(SECRETS, namespace=ns, name="rockbot-ghost-bus")
