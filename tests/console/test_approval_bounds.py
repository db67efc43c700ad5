"""Issue 31 §1 on the real broker and the memory bus: the approval desk is every agent's, so one agent's flood of
requests (each asking to wait a year) cannot keep another agent's call from a person."""

from __future__ import annotations

import asyncio
import datetime
import uuid

from rockbot.agent.approvals import BusApprover
from rockbot.bus import Delivery, Principal
from rockbot.bus.topology import CONSOLE_APPROVALS, agent_replies
from rockbot.console.approvals import MAX_WAIT_SECONDS, PENDING_PER_AGENT, ApprovalDesk
from rockbot.contracts.approvals import ApprovalDecision, ApprovalRequest
from tests.console.conftest import Login
from tests.waiting import bounded, eventually

FLOODER = Principal.agent(namespace="team-a", name="flooder")
HELPER = Principal.agent(namespace="team-b", name="helper")
#: As many as the issue's flooder sent, as many as the desk took ahead before.
FLOOD = 1000


def request_of(agent: Principal, *, seconds: float, reply_to: str) -> ApprovalRequest:
    now = datetime.datetime.now(datetime.UTC)
    return ApprovalRequest(
        approval_id=uuid.uuid4().hex, namespace=agent.namespace, agent=agent.name, session_id="s1",
        tool_call_id="c1", tool_name="delete_database", arguments='{"name": "prod"}', requested_at=now,
        expires_at=now + datetime.timedelta(seconds=seconds), on_timeout="Allow", reply_to=reply_to,
    )  # fmt: skip


async def test_one_agents_flood_of_year_long_requests_cannot_keep_anothers_call_from_a_person(
        bus_login: Login) -> None:
    desk = ApprovalDesk()
    await desk.start(bus=await bus_login(Principal.service("console")))
    flooder, helper = await bus_login(FLOODER), await bus_login(HELPER)
    slot = agent_replies(namespace=FLOODER.namespace, name=FLOODER.name, slot=0)
    denied: list[ApprovalDecision] = []

    async def count(delivery: Delivery) -> None:
        denied.append(delivery.decode(ApprovalDecision))

    await flooder.consume(queue=slot, handler=count, prefetch=64)
    year = 365 * 24 * 3600.0
    try:
        for start in range(0, FLOOD, 100):
            await asyncio.gather(*(flooder.publish(
                queue=CONSOLE_APPROVALS, body=(request := request_of(FLOODER, seconds=year, reply_to=slot.name)),
                message_id=request.approval_id, correlation_id=request.approval_id, reply_to=slot.name,
                expires_after_seconds=year,
            ) for _ in range(start, min(start + 100, FLOOD))))  # fmt: skip
        asked = request_of(HELPER, seconds=600, reply_to="")
        decision = asyncio.create_task(BusApprover(bus=helper).ask(asked))

        async def helpers_call_waits() -> None:
            assert asked.approval_id in {request.approval_id for request in desk.pending()}

        await eventually(helpers_call_waits, within=60)  # a person sees it (before: never, behind the flood)
        held = [request for request in desk.pending() if request.agent == FLOODER.name]
        assert len(held) == PENDING_PER_AGENT
        latest = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=MAX_WAIT_SECONDS)
        assert all(request.expires_at <= latest for request in held)  # not a year: the longest an Agent may ask

        async def the_rest_denied_at_once() -> None:
            assert len(denied) == FLOOD - PENDING_PER_AGENT

        await eventually(the_rest_denied_at_once, within=60)
        assert {(d.approved, d.decided_by) for d in denied} == {(False, "service.console")}
        assert "the most one agent may have waiting" in denied[0].reason
        await desk.decide(approval_id=asked.approval_id, approved=True, reason="fine", decided_by="alice")
        answer = await bounded(decision, within=30, what="the helper's decision")
        assert (answer.approved, answer.decided_by) == (True, "alice")
    finally:
        await desk.stop()
