"""Approvals end to end: an agent's risky call waits on the bus, the console shows it, a person with
`create agents/approve` decides over HTTP (RBAC on the real API server), and the decision reaches the
agent from the console's login only; a person without the right gets 403 and nothing changes."""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from rockbot.agent.approvals import BusApprover
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import CONSOLE, MemoryBroker, Principal
from rockbot.bus.topology import CONSOLE_APPROVALS
from rockbot.console.approvals import ApprovalDesk, event_on_agent
from rockbot.console.auth_sessions import COOKIE_NAME, Sessions
from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import AccessReviewer
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.contracts.approvals import ApprovalRequest
from rockbot.kube import AGENTS, EVENTS, KubeClient
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_approvals import RAN, delete_database
from tests.agent.test_loop import tool_set
from tests.buses import login
from tests.console.conftest import Rbac, agent_body, service_account_token
from tests.fixtures.llm import ScriptedCall, Turn
from tests.waiting import eventually

VIEWER = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}]"
APPROVER = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}, " \
           "{apiGroups: [rockbot.dev], resources: [agents/approve], verbs: [create]}]"


@dataclass(kw_only=True)
class Setup:
    url: str
    desk: ApprovalDesk
    agent: AgentRuntime
    namespace: str
    broker: MemoryBroker


@pytest.fixture
async def setup(kube_admin: KubeClient, namespaces: list[str], scripted_llm) -> AsyncIterator[Setup]:
    mine = namespaces[0]
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="helper"))
    broker = MemoryBroker()
    me = Principal.agent(namespace=mine, name="helper")
    console_bus = await login(broker, CONSOLE)
    agent_bus = await login(broker, me)
    desk = ApprovalDesk(on_pending=event_on_agent(kube_admin))
    await desk.start(bus=console_bus)
    gate = Gate(tokens=TokenReviewer(kube=kube_admin, ttl=0), sessions=Sessions())
    runner = web.AppRunner(build_app(gate=gate, authorizer=AccessReviewer(kube=kube_admin, ttl=0), kube=kube_admin,
                                     desk=desk))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    RAN.clear()
    config = agent_config(llm_url=scripted_llm.url, name="helper", namespace=mine,
                          approvals={"delete_database": {"timeout_seconds": 60}})
    agent = AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, tool_sets=[tool_set(delete_database)],
                                     bus=agent_bus)
    agent.approvals.approver = BusApprover(bus=agent_bus)
    async with agent:
        try:
            yield Setup(url=f"http://127.0.0.1:{runner.addresses[0][1]}", desk=desk, agent=agent, namespace=mine,
                        broker=broker)
        finally:
            await desk.stop()
            await runner.cleanup()
            await agent_bus.close()
            await console_bus.close()


async def person(kube_admin: KubeClient, setup: Setup, *, rbac: Rbac, name: str, rules: str) -> dict[str, str]:
    """Headers of a logged-in browser of ServiceAccount `name` granted `rules`, with its CSRF token."""
    token = await service_account_token(kube_admin, namespace=setup.namespace, name=name)
    rbac.grant(namespace=setup.namespace, user=f"system:serviceaccount:{setup.namespace}:{name}", rules=rules,
               name=name)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{setup.url}/login", data={"token": token}, allow_redirects=False) as answer:
            cookie = answer.cookies[COOKIE_NAME].value
        async with http.get(f"{setup.url}/approvals", headers={"Cookie": f"{COOKIE_NAME}={cookie}"}) as page:
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', await page.text())
    assert csrf is not None
    return {"Cookie": f"{COOKIE_NAME}={cookie}", "csrf": csrf.group(1)}


async def decide(setup: Setup, who: dict[str, str], approval_id: str, decision: str, reason: str = "") -> int:
    async with aiohttp.ClientSession() as http, http.post(
        f"{setup.url}/approvals/{approval_id}", headers={"Cookie": who["Cookie"], "Origin": setup.url},
        data={"csrf": who["csrf"], "decision": decision, "reason": reason}, allow_redirects=False,
    ) as answer:
        return answer.status


async def waiting_call(setup: Setup) -> ApprovalRequest:
    async def one() -> ApprovalRequest:
        pending = setup.desk.pending()
        assert pending, "no call waits for approval yet"
        return pending[0]

    return await eventually(one, within=10)


async def test_a_denial_needs_the_right_and_reaches_the_model_with_who_and_why(
    rbac: Rbac, setup: Setup, kube_admin: KubeClient, scripted_llm
) -> None:
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="delete_database", arguments={"name": "prod"})]),
                      Turn(text="I could not."))
    turn = asyncio.create_task(setup.agent.chat("s1", "drop prod", caller="service.test"))
    call = await waiting_call(setup)
    assert (call.namespace, call.agent, call.tool_name) == (setup.namespace, "helper", "delete_database")

    bob = await person(kube_admin, setup, name="bob", rules=VIEWER, rbac=rbac)
    async with aiohttp.ClientSession() as http, http.get(f"{setup.url}/approvals",
                                                         headers={"Cookie": bob["Cookie"]}) as page:
        text = await page.text()
    assert "delete_database" in text and "&#34;prod&#34;" in text and "Approving needs" in text
    assert await decide(setup, bob, call.approval_id, "approve") == 403
    assert setup.desk.pending() == [call] and RAN == [] and not turn.done()  # nothing changed

    alice = await person(kube_admin, setup, name="alice", rules=APPROVER, rbac=rbac)
    assert await decide(setup, alice, call.approval_id, "deny", reason="not on a Friday") == 303
    await asyncio.wait_for(turn, 10)
    assert RAN == []
    error = json.loads(scripted_llm.requests[1].messages[-1]["content"])["error"]
    assert error["code"] == "Rejected"
    assert f"system:serviceaccount:{setup.namespace}:alice denied" in error["message"]
    assert "not on a Friday" in error["message"]
    assert await decide(setup, alice, call.approval_id, "approve") == 404  # decided once, for good

    events = (await kube_admin.list(EVENTS, namespace=setup.namespace)).items
    posted = [e for e in events if e["reason"] == "ToolCallWaitingForApproval"]
    assert len(posted) == 1 and posted[0]["involvedObject"]["name"] == "helper"
    assert posted[0]["source"]["component"] == "rockbot-console"


async def test_an_approved_call_runs(rbac: Rbac, setup: Setup, kube_admin: KubeClient, scripted_llm) -> None:
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="delete_database", arguments={"name": "prod"})]),
                      Turn(text="Done."))
    turn = asyncio.create_task(setup.agent.chat("s1", "drop prod", caller="service.test"))
    call = await waiting_call(setup)
    alice = await person(kube_admin, setup, name="alice", rules=APPROVER, rbac=rbac)
    assert await decide(setup, alice, call.approval_id, "approve") == 303
    assert (await asyncio.wait_for(turn, 10)).answer == "Done."
    assert RAN == ["prod"] and scripted_llm.requests[1].messages[-1]["content"] == "deleted prod"


async def test_an_agent_cannot_ask_in_another_agents_name(setup: Setup) -> None:
    evil = Principal.agent(namespace=setup.namespace, name="evil")
    evil_bus = await login(setup.broker, evil)
    now = datetime.datetime.now(datetime.UTC)
    forged = ApprovalRequest(
        approval_id="forged", namespace=setup.namespace, agent="helper", session_id="s", tool_call_id="c",
        tool_name="delete_database", arguments="{}", requested_at=now, expires_at=now + datetime.timedelta(minutes=5),
        on_timeout="Deny",
    )  # fmt: skip
    replies = await evil_bus.own_replies()
    await evil_bus.publish(queue=CONSOLE_APPROVALS, body=forged, reply_to=replies.name)

    async def refused() -> None:
        letters = await setup.broker.dead_letters()
        assert [letter.queue for letter in letters] == [CONSOLE_APPROVALS.name], "the desk has not refused it yet"

    await eventually(refused, within=10)
    assert setup.desk.pending() == []
    await evil_bus.close()
