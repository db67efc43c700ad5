"""The steps every delivery takes once its source has checked it: decide, render, record, send.

1. precheck on the status as last known (no write): seen before, suspended, stale, folded;
2. `when` and the prompt, rendered in the sandbox (an error fails the run, recorded with its reason);
3. admission on the stored status, written before anything is sent (see `ledger`);
4. the run published to the agent's inbox.
A delivery seen before whose run is still active, with the same body, is sent again: the inbox
runs a copy of a request once, and a crash between steps 3 and 4 leaves nothing unsent for good.
Steps 3 and 4 run as a task of their own, which a caller that goes away (a webhook client hanging
up) does not cancel and which `stop()` waits for: a recorded run is always sent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rockbot.bus import BusError
from rockbot.clock import Clock
from rockbot.gateway import admission
from rockbot.gateway.admission import Decision, Offer
from rockbot.gateway.catalog import Catalog, Entry
from rockbot.gateway.dispatch import Dispatch
from rockbot.gateway.templates import RenderError

log = logging.getLogger(__name__)


class Intake:
    def __init__(self, *, catalog: Catalog, dispatch: Dispatch, clock: Clock) -> None:
        self._catalog = catalog
        self._dispatch = dispatch
        self._ledger = dispatch.ledger
        self._clock = clock
        self._in_flight: set[asyncio.Task[Decision]] = set()

    async def take(self, entry: Entry, offer: Offer, context: dict[str, Any]) -> Decision:
        """Decide on one delivery, record it and send its run; the decision says what happened."""
        assert entry.prompt is not None  # entries with a problem are not served
        now = self._clock.now()
        checked = await self._ledger.change(
            entry.key, lambda trigger, status: admission.precheck(trigger, status, offer, now=now)
        )
        if checked.outcome == "seen" and checked.resend:
            await self._resend(entry, checked, context)
        if checked.outcome != "new":
            return checked
        prompt = render_error = None
        try:
            if not await entry.prompt.applies(context):
                return Decision("ignored", message="spec.when is false for this delivery: no run")
            prompt = await entry.prompt.render(context)
        except RenderError as exc:
            render_error = str(exc)
        task = asyncio.create_task(self._record_and_send(entry, offer, prompt=prompt, render_error=render_error))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        """Wait for the deliveries being recorded and sent."""
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _record_and_send(
        self, entry: Entry, offer: Offer, *, prompt: str | None, render_error: str | None
    ) -> Decision:
        agent = self._catalog.agent(entry)
        now = self._clock.now()
        decision = await self._ledger.change(entry.key, lambda trigger, status: admission.admit(
            trigger, status, offer, agent=agent, render_error=render_error, now=now))  # fmt: skip
        if decision.outcome != "started":
            return decision
        assert prompt is not None
        try:
            await self._dispatch.send(entry.trigger, run=decision.run_id, prompt=prompt)
        except BusError as exc:
            return Decision("undelivered", run_id=decision.run_id,
                            message=f"run {decision.run_id} was recorded, but the agent's inbox refused it ({exc}); "
                            "it is recorded Failed")  # fmt: skip
        log.info("Trigger %s/%s started run %s for delivery %s", *entry.key, decision.run_id, offer.delivery_id)
        return decision

    async def _resend(self, entry: Entry, seen: Decision, context: dict[str, Any]) -> None:
        assert entry.prompt is not None
        try:
            prompt = await entry.prompt.render(context)
            await self._dispatch.send(entry.trigger, run=seen.run_id, prompt=prompt)
        except (RenderError, BusError) as exc:
            log.warning("could not send run %s of Trigger %s/%s again: %s", seen.run_id, *entry.key, exc)
