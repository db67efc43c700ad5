"""What the permissions function lets the gateway do, and the agents it sends Trigger runs to."""

from __future__ import annotations

import pytest

from rockbot.bus import CONSOLE, GATEWAY, OPERATOR, SCRIPTS_MANAGER, Nacked, Principal, permissions_for, topology
from rockbot.bus.topology import GATEWAY_RUNS, OPERATOR_USAGE, service_replies
from rockbot.contracts.progress import TextDelta, TurnProgress

TRIAGE = Principal.agent(namespace="team-a", name="triage")


def test_the_gateway_puts_runs_on_inboxes_and_reads_only_its_runs_queue() -> None:
    gateway = permissions_for(GATEWAY)
    assert gateway.allows("topic_write", "agent.team-a.triage.inbox")
    for elsewhere in ("script.invoke", "operator.scheduling", "operator.scheduling.runs", "gateway.runs",
                      "agent.team-a.triage.replies.p1", "agent.team-a.triage.scheduling-replies.p1"):
        assert not gateway.allows("topic_write", elsewhere), elsewhere
    assert gateway.allows("read", GATEWAY_RUNS.name)
    assert not gateway.allows("read", "operator.scheduling.runs") and not gateway.allows("read", "script.invoke")
    assert gateway.configure == "^$" and gateway.topic_read == "^$"  # declares and binds nothing itself


def test_only_agents_the_gateway_calls_answer_it_and_nobody_else_reads_its_answers() -> None:
    assert permissions_for(TRIAGE, called_by=[OPERATOR, GATEWAY]).allows("topic_write", GATEWAY_RUNS.name)
    assert not permissions_for(TRIAGE, called_by=[OPERATOR]).allows("topic_write", GATEWAY_RUNS.name)
    for other in (OPERATOR, SCRIPTS_MANAGER, TRIAGE, Principal.service("local")):
        assert not permissions_for(other).allows("read", GATEWAY_RUNS.name), other


def test_agents_report_their_token_usage_and_only_the_operator_reads_the_reports() -> None:
    assert permissions_for(TRIAGE).allows("topic_write", OPERATOR_USAGE.name)
    assert permissions_for(OPERATOR).allows("read", OPERATOR_USAGE.name)
    for other in (TRIAGE, SCRIPTS_MANAGER, GATEWAY, Principal.service("local")):
        assert not permissions_for(other).allows("read", OPERATOR_USAGE.name), other
    assert not permissions_for(GATEWAY).allows("topic_write", OPERATOR_USAGE.name)


def test_the_console_puts_chat_turns_on_inboxes_and_only_it_reads_its_own_reply_queues() -> None:
    console = permissions_for(CONSOLE)
    assert console.allows("topic_write", "agent.team-a.triage.inbox")
    assert console.allows("configure", "service.console.replies.a1b2") and console.allows("read",
                                                                                          "service.console.replies.a1b2")
    for elsewhere in ("script.invoke", "operator.scheduling", "gateway.runs", "service.gateway.replies.x"):
        assert not console.allows("topic_write", elsewhere), elsewhere
    agent = permissions_for(TRIAGE, called_by=[OPERATOR, GATEWAY, CONSOLE])
    assert agent.allows("topic_write", "service.console.replies.a1b2")  # its progress and answers
    assert not agent.allows("read", "service.console.replies.a1b2") and not agent.allows("topic_read",
                                                                                          "service.console.replies.a1b2")
    for other in (TRIAGE, GATEWAY, Principal.service("local")):
        assert not permissions_for(other).allows("read", "service.console.replies.a1b2"), other


async def test_an_agent_cannot_grow_the_consoles_reply_queue_without_end(amqp_broker, monkeypatch) -> None:
    """Every agent may write to the console's reply queues (its chat progress): the broker bounds each one, so a
    hostile agent's flood is refused at the bound instead of growing the broker's memory."""
    monkeypatch.setitem(topology._REPLIES, "x-max-length", 3)  # the bound, made small enough to reach
    console = await amqp_broker.connect(CONSOLE.name, permissions_for(CONSOLE))
    replies = service_replies(service="console", instance="flooded")
    await console.declare(replies)
    agent = await amqp_broker.connect(TRIAGE.name, permissions_for(TRIAGE, called_by=[CONSOLE]))
    progress = TurnProgress(request_id="turn-1", seq=0, event=TextDelta(text="flood"))
    for _ in range(3):
        await agent.publish(queue=replies, body=progress)
    with pytest.raises(Nacked):
        await agent.publish(queue=replies, body=progress)
