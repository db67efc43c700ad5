"""Posting a turn to an Agent's chat page: the person's conversation is read from the run store while the cluster's
RBAC (the real API server) is asked whether they may chat, not after it; a person RBAC refuses gets 403 and nothing
reaches the agent's inbox."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp

from rockbot.bus import CONSOLE, MemoryBroker, Principal
from rockbot.bus.topology import agent_inbox
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import AccessReviewer, Action
from rockbot.console.chat import ChatRelay
from rockbot.console.store import Store
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.kube import KubeClient
from tests.agent.test_web_rest import serving
from tests.buses import login
from tests.console.conftest import Rbac
from tests.waiting import bounded

CHATTER = "[{apiGroups: [rockbot.dev], resources: [agents/chat], verbs: [create]}]"


class AnswersOnceTheConversationIsRead:
    """The cluster's RBAC, answering a user only once that user's conversation is being read from the store: a
    console that read it only after RBAC's answer would wait here until the bound (and answer 500)."""

    def __init__(self, *, rbac: AccessReviewer, reading: dict[str, asyncio.Event]) -> None:
        self._rbac = rbac
        self._reading = reading

    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool:
        read = self._reading.setdefault(f"console:{identity.username}", asyncio.Event())
        await bounded(read.wait(), within=15, what=f"{identity.username}'s conversation read while RBAC is asked")
        return await self._rbac.allowed(identity=identity, namespace=namespace, action=action)


def console_of(user: str, *, relay: ChatRelay, store: Store, authorizer: AnswersOnceTheConversationIsRead,
               kube: KubeClient, sessions: Sessions) -> contextlib.AbstractAsyncContextManager[str]:
    """The console's pages as `rockbot local` serves them to `user` (on loopback), with the given relay and RBAC."""
    gate = Gate(tokens=None, sessions=sessions, local_identity=Identity(username=user))
    return serving(build_app(gate=gate, authorizer=authorizer, kube=kube, store=store, chat=relay,
                             secure_cookie=False), host="127.0.0.1")  # fmt: skip


async def test_the_conversation_is_read_while_rbac_is_asked_and_a_refused_turn_sends_nothing(
        kube_admin: KubeClient, namespaces: list[str], rbac: Rbac, tmp_path: Path) -> None:
    namespace = namespaces[0]
    rbac.grant(namespace=namespace, user="alice", rules=CHATTER, name="chatter")  # bob: no right to chat
    store = await Store.open(url=f"sqlite:///{tmp_path / 'runs.db'}")
    reading: dict[str, asyncio.Event] = {}
    session_history = store.session_history

    async def observed(**key: object):
        reading.setdefault(str(key["caller"]), asyncio.Event()).set()
        return await session_history(**key)

    store.session_history = observed  # type: ignore[method-assign]
    broker = MemoryBroker()
    helper = Principal.agent(namespace=namespace, name="helper")
    console_bus = await login(broker, CONSOLE)
    helper_bus = await login(broker, helper, called_by=[CONSOLE])
    relay = ChatRelay(timeout_seconds=30, store=store)
    await relay.start(bus=console_bus)
    turns: list[InboxRequest] = []

    async def answer(delivery) -> None:  # the agent: answers each turn at once
        request = delivery.decode(InboxRequest)
        turns.append(request)
        await helper_bus.publish(queue=relay.replies, correlation_id=request.request_id,
                                 body=InboxReply(request_id=request.request_id, session_id=request.session_id,
                                                 answer=f"hello {request.on_behalf_of}"))  # fmt: skip

    inbox = await helper_bus.consume(queue=agent_inbox(namespace=namespace, name="helper"), handler=answer)
    sessions = Sessions()
    authorizer = AnswersOnceTheConversationIsRead(rbac=AccessReviewer(kube=kube_admin, ttl=0), reading=reading)
    headers = {"X-CSRF-Token": sessions.csrf_token(principal="local")}
    try:
        async with aiohttp.ClientSession() as http:
            for user in ("alice", "bob"):
                async with console_of(user, relay=relay, store=store, authorizer=authorizer, kube=kube_admin,
                                      sessions=sessions) as url:  # fmt: skip
                    response = await http.post(f"{url}/agents/{namespace}/helper/chat", headers=headers,
                                               json={"session": "s1", "message": "hi"})  # fmt: skip
                    body = await response.text()
                if user == "alice":
                    assert response.status == 200 and "event: answer" in body and "hello alice" in body, body
                else:
                    assert response.status == 403 and "bob may not create agents/chat" in body, body
    finally:
        await inbox.close()
        await relay.stop()
        for bus in (console_bus, helper_bus):
            await bus.close()
        await store.close()
    assert [(turn.on_behalf_of, turn.content) for turn in turns] == [("alice", "hi")]  # bob's turn was never sent
    assert turns[0].conversation is not None and turns[0].conversation.messages == []  # read, carried (none yet)
