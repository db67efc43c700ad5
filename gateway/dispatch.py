"""Runs to the agents and answers back: publish a recorded run to the inbox, complete it from the reply, time it out.

A run is published only after its record landed (see `ledger`), with a request id that names the
Trigger and the run, so any copy (a resend, a redelivery) is run once by the inbox. Answers arrive on
one queue every replica reads (`gateway.runs`), so a run started before a restart is still
completed; an answer counts only from the Trigger's own Agent (the broker vouches for the sender)
and only while the run is active. A run without an answer is failed at its `runTimeoutSeconds` by
whichever replica's timer fires first (the write makes it once). Sending a run is a span (`trigger
run`, with the run id), in the webhook request's trace; the agent's turn is its child.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable

from rockbot import runs
from rockbot.bus import BadMessage, Bus, BusError, Delivery, Principal, Subscription
from rockbot.bus.topology import Queue, agent_inbox
from rockbot.clock import Clock
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.gateway import admission
from rockbot.gateway.admission import KIND
from rockbot.gateway.ledger import Key, Ledger
from rockbot.kube import ApiError, NotFound
from rockbot.resources.trigger import Trigger, TriggerStatus
from rockbot.tasks import cancel_and_wait
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

#: Told when a run ends with the agent's answer: (trigger, run id, answer, error).
Completed = Callable[[Key, str, str | None, str | None], None]


def key_of(trigger: Trigger) -> Key:
    return trigger.metadata["namespace"], trigger.metadata["name"]


class Dispatch:
    def __init__(
        self, *, bus: Bus, ledger: Ledger, clock: Clock, replies: Queue, on_completed: Completed | None = None
    ) -> None:
        self._bus = bus
        self.ledger = ledger
        self._clock = clock
        self._replies = replies
        self._on_completed = on_completed
        self._subscription: Subscription | None = None
        self._timers: dict[Key, tuple[datetime.datetime, asyncio.Task[None]]] = {}

    async def start(self) -> None:
        """Read the answers; `NoRoute` while the replies queue is not provisioned yet."""
        self._subscription = await self._bus.consume(queue=self._replies, handler=self._on_reply, prefetch=32)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()
            self._subscription = None
        await cancel_and_wait(*(task for _, task in self._timers.values()))
        self._timers.clear()

    async def send(self, trigger: Trigger, *, run: str, prompt: str) -> None:
        """Publish a recorded run to its agent's inbox; if the bus refuses, record it Failed and raise `BusError`."""
        namespace, name = key_of(trigger)
        request_id = runs.request_id(kind=KIND, namespace=namespace, name=name, run=run)
        request = InboxRequest(kind="trigger", request_id=request_id, session_id=request_id, content=prompt,
                               reply_to=self._replies.name)  # fmt: skip
        try:
            with tracer.start_as_current_span("trigger run", attributes={
                "rockbot.trigger": f"{namespace}/{name}", "rockbot.run.id": run, "rockbot.request.id": request_id,
                "gen_ai.agent.name": trigger.spec.agent_ref.name,
            }):  # the agent's turn is its child: a run's whole trace is found by its id  # fmt: skip
                await self._bus.publish(
                    queue=agent_inbox(namespace=namespace, name=trigger.spec.agent_ref.name), body=request,
                    message_id=request_id, correlation_id=request_id, reply_to=self._replies.name,
                )  # fmt: skip
        except BusError as exc:
            log.warning("could not send run %s of Trigger %s/%s: %s", run, namespace, name, exc)
            await self._complete((namespace, name), run, answer=None,
                                 error=f"could not deliver the run to the agent's inbox: {exc}")  # fmt: skip
            raise

    def written(self, key: Key, trigger: Trigger, status: TriggerStatus) -> None:
        """After every change to a Trigger's status: wake up when its first active run times out."""
        at = admission.next_expiry(trigger, status)
        current = self._timers.get(key)
        if current is not None and current[0] == at:
            return
        if current is not None:
            current[1].cancel()
            del self._timers[key]
        if at is not None:
            self._timers[key] = (at, asyncio.create_task(self._expire_at(key, at), name=f"expire {key}"))

    async def _expire_at(self, key: Key, at: datetime.datetime) -> None:
        await self._clock.sleep_until(at)
        self._timers.pop(key, None)
        now = self._clock.now()
        try:
            await self.ledger.change(key, lambda trigger, status: admission.expire(trigger, status, now=now))
        except NotFound:
            return
        except ApiError as exc:  # the next change (or the resync) sets a new timer
            log.warning("could not time out the runs of Trigger %s/%s: %s", *key, exc)

    async def _on_reply(self, delivery: Delivery) -> None:
        try:
            reply = delivery.decode(InboxReply)
        except BadMessage as exc:
            log.warning("dropping an unreadable run reply from %s: %s", delivery.user_id, exc)
            return
        parsed = runs.parse_request_id(reply.request_id, kind=KIND)
        if parsed is None:
            log.warning("dropping a reply for %r, which is not a Trigger run", reply.request_id)
            return
        namespace, name, run = parsed
        answer, error = runs.outcome_of(reply)
        await self._complete((namespace, name), run, answer=answer, error=error, sender=delivery.sender,
                             agent_run=reply.run_id or "")

    async def _complete(
        self, key: Key, run: str, *, answer: str | None, error: str | None, sender: Principal | None = None,
        agent_run: str = "",
    ) -> None:
        now = self._clock.now()

        def change(trigger: Trigger, status: TriggerStatus) -> tuple[int, str] | None:
            """(log level, why) the answer does not count, or None when it completed the run."""
            if not runs.belongs_to(run, uid=str(trigger.metadata.get("uid", ""))):
                return logging.INFO, "it is a run of an earlier Trigger by that name"
            agent = Principal.agent(namespace=key[0], name=trigger.spec.agent_ref.name)
            if sender is not None and sender != agent:
                return logging.WARNING, f"it comes from {sender}, but the run was sent to {agent}"
            if not admission.complete(trigger, status, run=run, answer=answer, error=error, now=now,
                                      agent_run=agent_run):
                return logging.INFO, "the run is no longer active (answered, timed out or replaced)"
            return None

        try:
            ignored = await self.ledger.change(key, change)
        except NotFound:
            log.info("the answer to run %s came after Trigger %s/%s was deleted", run, *key)
            return
        if ignored is not None:
            log.log(ignored[0], "ignoring the answer to run %s of Trigger %s/%s: %s", run, *key, ignored[1])
        elif self._on_completed is not None:
            self._on_completed(key, run, answer, error)
