"""People chat with agents through the console: a turn goes to the agent's inbox as `service.console`, naming
the person the console validated, and the agent's progress comes back on the console's own reply queue.

The console never holds an agent's HTTP token: it talks to agents the way the platform's services do, over
the bus with its own broker login. The agent takes `on_behalf_of` only from that login (the broker checks
`user_id`), so no agent or other service can speak for a person, and it records the run's caller as
`console:<user>`: the conversation (kept in the run store) is that person's alone. The console takes a
message on its reply queue only from the agent it asked and only under the turn's random request id, and holds a
bounded amount of it for a page that reads slowly: `TURN_BUFFER_BYTES` of one turn's progress, `AGENT_BUFFER_BYTES`
of all one agent's turns (past that its progress is dropped, never the answer); an unreadable message is dropped
alone, so the answer that follows it still reaches the person.

The console reads the person's conversation from the run store and sends it with the turn (`conversation`), so
the agent starts the model at once instead of asking `console.history` for it first (a bus round trip that was
most of what chat through the console added before the first token). A conversation too large for the inbox's
bound, or a store that does not answer, is left out: the agent then asks for it, as it does for other callers.
The page starts that read (`read_conversation`) as soon as it knows whose turn in which session it is, while the
cluster's RBAC is asked whether the person may chat: the read is the person's own conversation and nothing of it
leaves the console before RBAC says yes (a refused turn's read is cancelled or dropped).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from rockbot.bus import Bus, Delivery, Principal, Subscription
from rockbot.bus.errors import BadMessage, BusError
from rockbot.bus.topology import Queue, agent_inbox, service_replies
from rockbot.console.store import Store, StoreUnavailable
from rockbot.contracts.conversations import console_caller
from rockbot.contracts.inbox import MAX_REQUEST_BYTES, InboxReply, InboxRequest, Replay
from rockbot.contracts.progress import MAX_PROGRESS_BYTES, Event, TurnProgress
from rockbot.contracts.recording import HistoryReply

log = logging.getLogger(__name__)

#: The longest reply the console reads (it holds a whole answer); a longer one is dropped unread.
MAX_REPLY_BYTES = 4 * 1024 * 1024
#: A turn nobody took from the inbox by then is dropped there (the person is told, not kept waiting).
PICKUP_SECONDS = 60.0
#: What the console holds of one turn's progress while its browser reads slowly, and of all one agent's turns
#: together; past either, the agent's progress is dropped (the page shows the answer when it comes, which is never
#: dropped). Each held step counts its message's size and `STEP_OVERHEAD_BYTES`.
TURN_BUFFER_BYTES = 4 * 1024 * 1024
AGENT_BUFFER_BYTES = 16 * 1024 * 1024
STEP_OVERHEAD_BYTES = 1024
#: Messages taken from the reply queue before they are handled (each at most the bus's 8 MiB, while in flight).
PREFETCH = 16
#: Messages of the conversation sent with a turn at most (what an agent asks for by default).
CARRIED_MESSAGES = 200

Step = Event | InboxReply


class ChatFailed(Exception):
    """The turn could not be sent, or its answer did not come in time."""


@dataclass(kw_only=True)
class _Turn:
    agent: Principal
    #: What the agent sent, in its order, the answer last (one queue: the page's stream waits on nothing else), each
    #: with what it counts against the turn's and the agent's buffer.
    steps: asyncio.Queue[tuple[Step, int]] = field(default_factory=asyncio.Queue)
    buffered: int = 0
    answered: bool = False
    dropping: bool = False  # progress is being dropped (logged once per stretch)


class ChatRelay:
    """Sends people's turns to agents and hands back, in order, what each agent streams and its answer."""

    def __init__(self, *, instance: str | None = None, timeout_seconds: float = 900.0,
                 store: Store | None = None) -> None:
        self._bus: Bus | None = None
        self._store = store
        self._replies = service_replies(service="console", instance=instance or uuid.uuid4().hex[:12])
        self._timeout = timeout_seconds
        self._turns: dict[str, _Turn] = {}
        self._buffered: dict[Principal, int] = {}  # agent -> what its turns hold for their pages
        self._subscription: Subscription | None = None

    @property
    def replies(self) -> Queue:
        return self._replies

    async def start(self, *, bus: Bus) -> None:
        """Declare this console's reply queue on `bus` (the console's own login) and take what agents send there."""
        self._subscription = await bus.consume(queue=self._replies, handler=self._received, prefetch=PREFETCH)
        self._bus = bus

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()
            self._subscription = None

    def read_conversation(self, *, namespace: str, agent: str, user: str,
                          session_id: str) -> asyncio.Task[HistoryReply | None]:
        """Start reading `user`'s conversation `session_id` with the agent, for `turn` (None: it goes without)."""
        return asyncio.ensure_future(self._conversation(namespace, agent, user, session_id))

    async def turn(self, *, namespace: str, agent: str, user: str, session_id: str, content: str,
                   conversation: Awaitable[HistoryReply | None] | None = None,
                   replay: Replay | None = None) -> AsyncIterator[Step]:
        """Send `content` as `user`'s turn in `session_id` and yield the agent's events, then its `InboxReply`;
        `conversation`: that conversation as `read_conversation` reads it (read here when not given); `replay`:
        the turn replays a recorded run (`console.replay`).

        `ChatFailed` when the inbox refuses the message or nothing more comes within the timeout."""
        if self._bus is None:
            raise ChatFailed("the console is not connected to the bus yet: try again in a moment")
        bus = self._bus
        request_id = uuid.uuid4().hex
        target = Principal.agent(namespace=namespace, name=agent)
        held = self._turns[request_id] = _Turn(agent=target)
        if conversation is None:
            conversation = self._conversation(namespace, agent, user, session_id)
        try:
            request = InboxRequest(kind="user_message", request_id=request_id, session_id=session_id,
                                   content=content, reply_to=self._replies.name, on_behalf_of=user, progress=True,
                                   conversation=await conversation, replay=replay)
            if len(request.model_dump_json()) > MAX_REQUEST_BYTES:  # the agent would refuse it: it asks instead
                request = request.model_copy(update={"conversation": None})
            try:
                await bus.publish(queue=agent_inbox(namespace=namespace, name=agent), body=request,
                                        message_id=request_id, correlation_id=request_id,
                                        reply_to=self._replies.name, expires_after_seconds=PICKUP_SECONDS)
            except BusError as exc:
                raise ChatFailed(f"the message could not be given to {namespace}/{agent}: {exc}") from exc
            async with asyncio.timeout(self._timeout):
                while not isinstance(step := self._taken(held, await held.steps.get()), InboxReply):
                    yield step
            yield step
        except TimeoutError:
            raise ChatFailed(f"{namespace}/{agent} did not answer within {self._timeout:g} s") from None
        finally:
            self._turns.pop(request_id, None)
            self._release(held, held.buffered)

    async def _conversation(self, namespace: str, agent: str, user: str, session_id: str) -> HistoryReply | None:
        """`user`'s conversation `session_id` with the agent as the run store keeps it; None when it cannot say."""
        if self._store is None:
            return None
        try:
            return await self._store.session_history(namespace=namespace, agent=agent, caller=console_caller(user),
                                                     session_id=session_id, max_messages=CARRIED_MESSAGES)
        except StoreUnavailable as exc:
            log.info("the conversation %s goes without its history (the agent asks for it): %s", session_id, exc)
            return None

    async def _received(self, delivery: Delivery) -> None:
        held = self._turns.get(delivery.correlation_id or "")
        if held is None:
            log.info("dropping a message on %s that no chat waits for (%s)", delivery.queue, delivery.correlation_id)
            return
        if delivery.sender != held.agent:
            log.warning("dropping a message on %s from %s: the turn went to %s", delivery.queue, delivery.user_id,
                        held.agent)
            return
        # no await from here on: handlers of one queue then finish in the order the agent sent
        try:
            if delivery.message_type == TurnProgress.__name__:
                event = delivery.decode(TurnProgress, max_bytes=MAX_PROGRESS_BYTES).event
                if not held.answered:
                    self._hold(held, event, cost=len(delivery.body) + STEP_OVERHEAD_BYTES)
            elif not held.answered:  # always held, however much progress waits
                reply = delivery.decode(InboxReply, max_bytes=MAX_REPLY_BYTES)
                held.answered = True
                self._hold(held, reply, cost=len(delivery.body) + STEP_OVERHEAD_BYTES, bounded=False)
        except BadMessage as exc:  # dropped alone: the turn goes on, and its answer is still taken
            log.warning("dropping an unreadable message from %s for chat %s: %s", delivery.user_id,
                        delivery.correlation_id, exc)

    def _hold(self, held: _Turn, step: Step, *, cost: int, bounded: bool = True) -> None:
        """Queue `step` for the turn's page, unless it is progress past the turn's or its agent's buffer."""
        agent_total = self._buffered.get(held.agent, 0)
        if bounded and (held.buffered + cost > TURN_BUFFER_BYTES or agent_total + cost > AGENT_BUFFER_BYTES):
            if not held.dropping:
                held.dropping = True
                log.warning("dropping progress of %s for a chat whose page reads too slowly: the turn holds %d "
                            "bytes (at most %d), the agent's turns %d (at most %d); its answer still comes",
                            held.agent, held.buffered, TURN_BUFFER_BYTES, agent_total, AGENT_BUFFER_BYTES)
            return
        held.dropping = False
        held.buffered += cost
        self._buffered[held.agent] = agent_total + cost
        held.steps.put_nowait((step, cost))

    def _taken(self, held: _Turn, entry: tuple[Step, int]) -> Step:
        step, cost = entry
        held.buffered -= cost
        self._release(held, cost)
        return step

    def _release(self, held: _Turn, cost: int) -> None:
        left = self._buffered.get(held.agent, 0) - cost
        if left > 0:
            self._buffered[held.agent] = left
        else:
            self._buffered.pop(held.agent, None)

    def buffered(self, agent: Principal) -> int:
        """What the console holds now of `agent`'s turns for their pages (the bound is `AGENT_BUFFER_BYTES`)."""
        return self._buffered.get(agent, 0)
