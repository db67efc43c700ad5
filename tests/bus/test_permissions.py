"""What the permissions function lets the gateway do, and the agents it sends Trigger runs to."""

from __future__ import annotations

from rockbot.bus import GATEWAY, OPERATOR, SCRIPTS_MANAGER, Principal, permissions_for
from rockbot.bus.topology import GATEWAY_RUNS, OPERATOR_USAGE

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
