"""What every console queue that answers agents shares: who asks, where the answer goes, and one agent's share.

The asking agent is the broker-validated sender, never a field of the request, and the answer goes only to one of
its own reply queues; anything else is refused (dead-lettered). A request is decoded within a bound, and at most
`per_agent` of one agent's are answered at once (`InFlight`): its others are refused meanwhile, so one agent's
flood never stands before another agent's. A subclass answers one request, or answers `None` to send nothing; one
that answers a service instead (the scripts-manager's file reads) says so in `asker`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from rockbot.bus import Bus, Delivery, Refused, Subscription
from rockbot.bus.identity import Principal
from rockbot.bus.shares import InFlight
from rockbot.bus.topology import agent_replies_prefix


class AgentRequests:
    """Answers agents' requests on one console queue; `start()`, then `stop()`."""

    #: What the requests are, for refusals ("a history request from ...").
    what: ClassVar[str]
    queue: ClassVar[str]
    prefetch: ClassVar[int]
    per_agent: ClassVar[int]
    max_bytes: ClassVar[int]
    #: The request's model (or a TypeAdapter of a union of them).
    request_type: ClassVar[Any]

    def __init__(self, *, bus: Bus) -> None:
        self._bus = bus
        self._in_flight = InFlight(per_sender=self.per_agent)
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._subscription = await self._bus.consume(queue=self.queue, handler=self._on_request, prefetch=self.prefetch)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close(drain_seconds=1.0)
            self._subscription = None

    #: Who may ask, for refusals.
    askers: ClassVar[str] = "an agent"

    def asker(self, delivery: Delivery) -> Principal | None:
        """Who asks, when it may and is answered on one of its own reply queues; None refuses the request."""
        return delivery.agent_answered_on_own(lambda p: agent_replies_prefix(namespace=p.namespace, name=p.name))

    async def answer(self, agent: Principal, request: Any) -> BaseModel | None:
        """The reply to one of `agent`'s requests; None sends none (the agent's wait ends in its timeout)."""
        raise NotImplementedError

    async def busy(self, agent: Principal, request: Any) -> None:
        """Called for a request past the agent's share in flight, before it is refused: a subclass may raise instead
        (a plain `BusError` puts it back on the queue after a pause)."""

    async def _on_request(self, delivery: Delivery) -> None:
        agent = self.asker(delivery)
        if agent is None:
            raise Refused(
                f"a {self.what} request from {delivery.user_id!r} must come from {self.askers} and be answered on one "
                f"of its own reply queues, not {delivery.reply_to!r}"
            )
        request = delivery.decode(self.request_type, max_bytes=self.max_bytes)
        with self._in_flight.slot(agent.user) as admitted:
            if not admitted:
                await self.busy(agent, request)
                raise Refused(f"{agent} already has {self.per_agent} {self.what} requests being answered")
            reply = await self.answer(agent, request)
        if reply is not None:
            await self._bus.reply(to=delivery, body=reply)
