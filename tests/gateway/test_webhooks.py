"""Webhook Triggers end to end: a signed POST to the gateway, a run on a real agent over the real broker, its
answer in the Trigger's history; and everything the endpoint refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rockbot.bus import GATEWAY, AmqpBus, Principal
from rockbot.bus.topology import GATEWAY_RUNS
from rockbot.contracts.inbox import InboxReply
from rockbot.gateway import app as gateway_app
from rockbot.gateway.webhooks import WebhookServer
from rockbot.kube import TRIGGERS
from tests.fixtures.llm import Turn
from tests.gateway.conftest import ISSUE, PUBLIC_URL, Cluster, StartGateway, send
from tests.readiness import record_readiness
from tests.waiting import eventually


async def test_a_signed_webhook_starts_one_run_and_the_answer_lands_in_the_history(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway
) -> None:
    scripted_llm.play(Turn(text="Labelled bug and browser:safari; asked the reporter for the console log."))
    await cluster.webhook_trigger()
    gateway = await start_gateway()
    status = await cluster.ready()
    assert status["webhookUrl"] == f"{PUBLIC_URL}/hooks/{cluster.ns}/issues"
    answer = await send(gateway, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert answer.status == 202, answer
    (record,) = await cluster.history(["Succeeded"])
    assert record["runId"] == answer.body["runId"]
    assert record["deliveryId"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert record["summary"] == "Labelled bug and browser:safari; asked the reporter for the console log."
    (request,) = scripted_llm.requests
    assert request.messages[-1] == {"role": "user", "content": "Triage issue #7 of acme/shop: Login fails on Safari"}
    assert (await cluster.status())["lastDelivery"]["id"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"



async def test_what_the_endpoint_refuses_is_refused_as_specified_and_never_runs(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway
) -> None:
    scripted_llm.play(Turn(text="Triaged."))
    await cluster.webhook_trigger(webhook={"secretKeyRef": {"name": "github-webhook", "key": "secret"},
                                           "maxBodyBytes": 4096})
    gateway = await start_gateway()
    await cluster.ready()
    forged = await send(gateway, key=b"a guess", delivery="d-forged")
    unsigned = await send(gateway, delivery="d-unsigned", headers={"X-Hub-Signature-256": ""})
    oversized = await send(gateway, {**ISSUE, "padding": "x" * 5000}, delivery="d-big")
    streamed = await send(gateway, {**ISSUE, "padding": "x" * 5000}, delivery="d-big-chunked", chunked=True)
    as_text = await send(gateway, delivery="d-text", headers={"Content-Type": "text/plain"})
    broken = await send(gateway, b"{not json", delivery="d-broken")
    unknown = await send(gateway, trigger="nothing-here")
    assert (forged.status, unsigned.status) == (401, 401), (forged, unsigned)
    assert "X-Hub-Signature-256" in forged.body["message"]
    assert oversized.status == 413 and "4096" in oversized.body["message"]
    assert streamed.status == 413 and "longer than this Trigger's limit of 4096 bytes" in streamed.body["message"]
    assert as_text.status == 415 and "application/json" in as_text.body["message"]
    assert broken.status == 400 and "not JSON" in broken.body["message"]
    assert unknown.status == 404
    first = await send(gateway, delivery="d-1")
    replayed = await send(gateway, delivery="d-1")
    assert (first.status, replayed.status) == (202, 409), (first, replayed)
    assert replayed.body["runId"] == first.body["runId"]
    await cluster.history(["Succeeded"])
    assert len(scripted_llm.requests) == 1
    assert [entry["id"] for entry in (await cluster.status())["deliveries"]] == ["d-1"]


async def test_a_burst_over_the_rate_limit_gets_429_and_nothing_is_recorded_for_it(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway
) -> None:
    scripted_llm.play(Turn(text="One."), Turn(text="Two."))
    await cluster.webhook_trigger(maxRunsPerMinute=2, successfulRunsHistoryLimit=5)
    gateway = await start_gateway()
    await cluster.ready()
    answers = await asyncio.gather(*(send(gateway, delivery=f"d-{index}") for index in range(6)))
    assert sorted(answer.status for answer in answers) == [202, 202, 429, 429, 429, 429], answers
    refused = [answer for answer in answers if answer.status == 429]
    assert all(1 <= int(answer.headers["Retry-After"]) <= 60 for answer in refused)
    assert "maxRunsPerMinute" in refused[0].body["message"]
    await cluster.history(["Succeeded", "Succeeded"])
    started = {answer.body["runId"] for answer in answers if answer.status == 202}
    assert {record["runId"] for record in (await cluster.status())["history"]} == started
    assert len((await cluster.status())["deliveries"]) == 2
    assert len(scripted_llm.requests) == 2


async def test_the_same_delivery_sent_twice_and_again_after_a_restart_runs_once(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway
) -> None:
    scripted_llm.play(Turn(text="Triaged once."))
    await cluster.webhook_trigger()
    first_gateway = await start_gateway()
    await cluster.ready()
    first = await send(first_gateway, delivery="d-1")
    again = await send(first_gateway, delivery="d-1")
    await first_gateway.stop()
    second_gateway = await start_gateway()
    after_restart = await send(second_gateway, delivery="d-1")
    assert [first.status, again.status, after_restart.status] == [202, 409, 409]
    assert first.body["runId"] == again.body["runId"] == after_restart.body["runId"]
    (record,) = await cluster.history(["Succeeded"])
    assert record["summary"] == "Triaged once."
    assert len(scripted_llm.requests) == 1


async def test_two_replicas_racing_on_one_delivery_run_it_once(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway
) -> None:
    scripted_llm.play(Turn(text="Triaged once."))
    await cluster.webhook_trigger()
    replicas = [await start_gateway(), await start_gateway()]
    await cluster.ready()
    answers = await asyncio.gather(*(send(replica, delivery="d-1") for replica in replicas))
    assert sorted(answer.status for answer in answers) == [202, 409], answers
    assert answers[0].body["runId"] == answers[1].body["runId"]
    await cluster.history(["Succeeded"])
    assert len(scripted_llm.requests) == 1


async def test_an_answer_from_another_agent_does_not_complete_the_run(
    cluster: Cluster, vhost, start_gateway: StartGateway
) -> None:
    await cluster.webhook_trigger()
    await vhost.url(cluster.triage, called_by=[GATEWAY])  # its inbox, where the run waits: no agent takes it here
    gateway = await start_gateway()
    await cluster.ready()
    sent = await send(gateway, delivery="d-1")
    assert sent.status == 202, sent
    run = sent.body["runId"]
    request_id = f"trigger/{cluster.ns}/issues/{run}"
    mallory = Principal.agent(namespace=cluster.ns, name="mallory")  # another agent the gateway may send runs to

    async def answer(principal: Principal, text: str) -> None:
        async with await AmqpBus.connect(url=await vhost.url(principal, called_by=[GATEWAY])) as bus:
            reply = InboxReply(request_id=request_id, session_id=request_id, answer=text, run_id=f"{principal.name}-1")
            await bus.publish(queue=GATEWAY_RUNS, body=reply, correlation_id=request_id)

    async def taken() -> None:
        assert (await asyncio.to_thread(vhost.queues))[GATEWAY_RUNS.name] == (0, 0)

    await answer(mallory, "Close it as won't fix.")
    await eventually(taken)
    status = await cluster.status()
    assert [active["runId"] for active in status["active"]] == [run] and status.get("history", []) == []
    await answer(cluster.triage, "Labelled bug.")
    (record,) = await cluster.history(["Succeeded"])
    assert record["summary"] == "Labelled bug." and record["agentRun"] == "triage-1"  # rockbot runs show triage-1


async def test_a_template_edited_into_one_that_does_not_compile_makes_the_trigger_not_ready(
    cluster: Cluster, start_gateway: StartGateway
) -> None:
    await cluster.webhook_trigger()
    gateway = await start_gateway()
    await cluster.ready()
    await cluster.kube.patch(TRIGGERS, namespace=cluster.ns, name="issues", body={"spec": {"prompt": "{% for %}"}})

    async def not_ready() -> None:
        status = await cluster.status()
        (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert (ready["status"], ready["reason"], status["observedGeneration"]) == ("False", "InvalidTemplate", 2)
        assert ready["message"].startswith("spec.prompt: line 1: ")

    await eventually(not_ready)
    refused = await send(gateway, delivery="d-1")
    assert refused.status == 503 and "spec.prompt: line 1" in refused.body["message"]


async def test_the_gateway_is_ready_only_once_it_listens_for_webhooks(
    cluster: Cluster, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod reported ready before its port listens gets webhooks it refuses to connect (the Service sends them)."""
    made = record_readiness(monkeypatch, gateway_app)
    said_before_listening: list[list[str]] = []

    class Observed(WebhookServer):
        async def start(self, **kwargs: Any) -> None:
            (readiness,) = made
            said_before_listening.append(readiness.reasons())
            await super().start(**kwargs)

    monkeypatch.setattr(gateway_app, "WebhookServer", Observed)
    gateway = await start_gateway()
    assert said_before_listening == [["not listening for webhooks yet"]]
    assert gateway.readiness.reasons() == []
