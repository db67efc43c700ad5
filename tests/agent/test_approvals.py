"""Tool calls that wait for a person: approved they run, denied or timed out the model reads why and nothing
ran, and a wait cut short (the pod restarting) never runs the tool."""

from __future__ import annotations

import asyncio
import datetime
import json

import pytest

from rockbot.agent.defining import tool
from rockbot.agent.events import ApprovalDecided, ApprovalRequested, ToolFinished
from rockbot.agent.recording import bus_publisher
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import Principal
from rockbot.contracts.approvals import ApprovalDecision, ApprovalRequest
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_loop import tool_set
from tests.agent.test_recording import (
    _only_run,
    console,  # noqa: F401 (a fixture)
)
from tests.buses import login
from tests.fixtures.llm import ScriptedCall, Turn
from tests.waiting import eventually

RAN: list[str] = []


@tool
async def delete_database(name: str) -> str:
    """Delete a database (risky)."""
    RAN.append(name)
    return f"deleted {name}"


class Person:
    """An approver whose decisions the test makes, one pending request at a time."""

    def __init__(self) -> None:
        self.pending: asyncio.Queue[tuple[ApprovalRequest, asyncio.Future[ApprovalDecision]]] = asyncio.Queue()

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        answer: asyncio.Future[ApprovalDecision] = asyncio.get_running_loop().create_future()
        await self.pending.put((request, answer))
        return await answer

    async def decide(self, *, approved: bool, reason: str = "") -> ApprovalRequest:
        request, answer = await asyncio.wait_for(self.pending.get(), 5)  # waits for the agent to ask
        now = datetime.datetime.now(datetime.UTC)
        answer.set_result(ApprovalDecision(approval_id=request.approval_id, approved=approved, reason=reason,
                                           decided_by="alice@example.com", decided_at=now))
        return request


def runtime(scripted_llm, *, approver, timeout: float = 30, on_timeout: str = "Deny") -> AgentRuntime:
    RAN.clear()
    config = agent_config(llm_url=scripted_llm.url,
                          approvals={"delete_database": {"timeout_seconds": timeout, "on_timeout": on_timeout}})
    return AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, tool_sets=[tool_set(delete_database)],
                                    approver=approver)


def play_one_call(scripted_llm) -> None:
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="delete_database", arguments={"name": "prod"})]),
                      Turn(text="Done."))


def tool_answer(scripted_llm) -> str:
    return scripted_llm.requests[1].messages[-1]["content"]


async def test_an_approved_call_runs_after_the_decision(scripted_llm):
    play_one_call(scripted_llm)
    person = Person()
    events = []
    async with runtime(scripted_llm, approver=person) as agent:
        turn = asyncio.create_task(agent.chat("s1", "drop prod", on_event=events.append, caller="service.test"))
        request = await person.decide(approved=True)
        result = await asyncio.wait_for(turn, 10)
    assert (request.tool_name, json.loads(request.arguments), request.namespace, request.agent) == (
        "delete_database", {"name": "prod"}, "team-a", "helper-bot")
    assert RAN == ["prod"] and tool_answer(scripted_llm) == "deleted prod" and result.answer == "Done."
    decided = next(e for e in events if isinstance(e, ApprovalDecided))
    assert (decided.outcome, decided.runs, decided.decided_by) == ("approved", True, "alice@example.com")
    kinds = [type(e).__name__ for e in events if type(e).__name__ != "TextDelta"]
    assert kinds == ["ToolStarted", "ApprovalRequested", "ApprovalDecided", "ToolFinished"]
    samples = agent.metrics.exposition().decode()
    assert 'rockbot_tool_approvals_total{agent="helper-bot",outcome="approved",tool="delete_database"} 1.0' in samples
    assert 'rockbot_tool_approvals_waiting{agent="helper-bot"} 0.0' in samples


async def test_a_denied_call_never_runs_and_the_model_reads_who_and_why(scripted_llm):
    play_one_call(scripted_llm)
    person = Person()
    events = []
    async with runtime(scripted_llm, approver=person) as agent:
        turn = asyncio.create_task(agent.chat("s1", "drop prod", on_event=events.append, caller="service.test"))
        await person.decide(approved=False, reason="not on a Friday")
        await asyncio.wait_for(turn, 10)
    assert RAN == []
    error = json.loads(tool_answer(scripted_llm))["error"]
    assert error["code"] == "Rejected"
    assert "alice@example.com denied" in error["message"] and "not on a Friday" in error["message"]
    finished = next(e for e in events if isinstance(e, ToolFinished))
    assert finished.error is not None and finished.error.code == "Rejected"


@pytest.mark.parametrize(("on_timeout", "runs"), [("Deny", False), ("Allow", True)])
async def test_nobody_deciding_in_time_follows_on_timeout(scripted_llm, on_timeout, runs):
    play_one_call(scripted_llm)
    person = Person()  # never decides
    async with runtime(scripted_llm, approver=person, timeout=0.2, on_timeout=on_timeout) as agent:
        await asyncio.wait_for(agent.chat("s1", "drop prod", caller="service.test"), 10)
    assert (RAN == ["prod"]) is runs
    if not runs:
        error = json.loads(tool_answer(scripted_llm))["error"]
        assert error["code"] == "Timeout" and "onTimeout: Deny" in error["message"]


async def test_without_an_approver_such_calls_are_refused(scripted_llm):
    play_one_call(scripted_llm)
    async with runtime(scripted_llm, approver=None) as agent:
        await asyncio.wait_for(agent.chat("s1", "drop prod", caller="service.test"), 10)
    assert RAN == [] and json.loads(tool_answer(scripted_llm))["error"]["code"] == "Rejected"


async def test_a_wait_cut_short_by_a_restart_never_runs_the_tool(scripted_llm):
    """The pod stops while a call waits: the turn is cancelled with the process, and a decision that comes
    later reaches nobody; the tool has not run."""
    play_one_call(scripted_llm)
    person = Person()
    events = []
    async with runtime(scripted_llm, approver=person) as agent:
        turn = asyncio.create_task(agent.chat("s1", "drop prod", on_event=events.append, caller="service.test"))
        request, answer = await asyncio.wait_for(person.pending.get(), 5)
        turn.cancel()  # what stopping the process does to the turn in flight
        with pytest.raises(asyncio.CancelledError):
            await turn
        assert answer.cancelled()  # a late approval has nothing left to resume
    assert RAN == [] and any(isinstance(e, ApprovalRequested) for e in events)
    assert not any(isinstance(e, ToolFinished) for e in events)
    assert 'rockbot_tool_approvals_waiting{agent="helper-bot"} 0.0' in agent.metrics.exposition().decode()
    assert request.tool_call_id == "call_0_0"


async def test_the_wait_and_the_decision_are_part_of_the_run(console, scripted_llm):  # noqa: F811
    broker, store = console
    play_one_call(scripted_llm)
    person = Person()
    bus = await login(broker, Principal.agent(namespace="team-a", name="helper-bot"))
    config = agent_config(llm_url=scripted_llm.url, approvals={"delete_database": {"timeout_seconds": 30}})
    agent = AgentRuntime.from_config(config, bus=bus, env={API_KEY_ENV: "k"}, tool_sets=[tool_set(delete_database)],
                                     publish_runs=bus_publisher(bus), approver=person)
    async with agent:
        turn = asyncio.create_task(agent.chat("s1", "drop prod", caller="http"))
        await person.decide(approved=False, reason="not on a Friday")
        await asyncio.wait_for(turn, 10)
    (run,) = await eventually(lambda: _only_run(store))
    detail = await store.get_run(run.run_id)
    approvals = [(e.name, e.status, e.data["decided_by"], e.data["reason"]) for e in detail.timeline
                 if e.kind == "approval"]
    assert approvals == [("delete_database", "WaitingForApproval", "", ""),
                         ("delete_database", "Denied", "alice@example.com", "not on a Friday")]
    (call,) = [e for e in detail.timeline if e.kind == "tool_call"]
    assert call.status == "Rejected" and "not on a Friday" in call.data["result"]
