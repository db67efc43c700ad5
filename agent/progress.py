"""A turn's progress, relayed over the bus to a requester that asked for it (`InboxRequest.progress`): the console
shows a person the answer as it streams and each tool call as it starts and ends.

The loop hands events to `ProgressRelay` without waiting for the broker: one sender publishes them in order,
text deltas that piled up meanwhile merged into one message, so a slow broker never slows the turn (each message
within what the requester reads: long text in pieces, a tool's arguments cut). If the
requester's queue is gone or refuses, the rest is dropped (the reply still goes out, the turn is unaffected).
"""

from __future__ import annotations

import asyncio
import logging

from rockbot.bus import Bus, BusError
from rockbot.bus.topology import Queue
from rockbot.contracts.progress import MAX_PROGRESS_CHARS, Event, TextDelta, ToolStarted, TurnProgress
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Events waiting to be sent at most (text merges, so only tool and approval events count); past it they are dropped.
MAX_PENDING = 1000
#: How long the reply waits for the progress before it (the requester sees a gap, never an answer lost).
FLUSH_SECONDS = 10.0


class ProgressRelay:
    def __init__(self, *, bus: Bus, reply_to: str, request_id: str) -> None:
        self._bus = bus
        self._queue = Queue(name=reply_to)
        self._request_id = request_id
        self._pending: list[Event] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._broken = False
        self._seq = 0
        self._sender = asyncio.create_task(self._send_forever(), name=f"progress {request_id}")

    def __call__(self, event: Event) -> None:
        """The turn's event sink: queue `event` (merged into a text delta still waiting), never wait."""
        if self._broken or self._closing:
            return
        if isinstance(event, TextDelta) and self._pending and isinstance(self._pending[-1], TextDelta):
            self._pending[-1] = TextDelta(text=self._pending[-1].text + event.text)
        elif len(self._pending) < MAX_PENDING:
            self._pending.append(event)
        self._wake.set()

    async def close(self) -> None:
        """Send what waits (within `FLUSH_SECONDS`), then stop: the reply goes out after every progress message."""
        self._closing = True
        self._wake.set()
        try:
            async with asyncio.timeout(FLUSH_SECONDS):
                await asyncio.shield(self._sender)
        except TimeoutError:
            log.warning("progress of %s not sent within %g s; the reply goes without it", self._request_id,
                        FLUSH_SECONDS)
            await cancel_and_wait(self._sender)

    async def _send_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            for event in _within_bounds(batch):
                if not await self._send(event):
                    return
            if self._closing and not self._pending:
                return

    async def _send(self, event: Event) -> bool:
        message = TurnProgress(request_id=self._request_id, seq=self._seq, event=event)
        self._seq += 1
        try:
            await self._bus.publish(queue=self._queue, body=message, correlation_id=self._request_id)
        except BusError as exc:  # the requester is gone or refuses: the turn goes on without telling it
            log.info("stopped relaying the progress of %s to %s: %s", self._request_id, self._queue.name, exc)
            self._broken = True
            self._pending.clear()
            return False
        return True


def _within_bounds(events: list[Event]) -> list[Event]:
    """The events as the requester reads them (`MAX_PROGRESS_BYTES` a message): merged text in pieces of at most
    `MAX_PROGRESS_CHARS`, a tool's arguments cut there (the call itself keeps them whole)."""
    bounded: list[Event] = []
    for event in events:
        if isinstance(event, TextDelta) and len(event.text) > MAX_PROGRESS_CHARS:
            bounded.extend(TextDelta(text=event.text[start:start + MAX_PROGRESS_CHARS])
                           for start in range(0, len(event.text), MAX_PROGRESS_CHARS))
        elif isinstance(event, ToolStarted) and len(event.arguments) > MAX_PROGRESS_CHARS:
            bounded.append(event.model_copy(update={"arguments": event.arguments[:MAX_PROGRESS_CHARS]}))
        else:
            bounded.append(event)
    return bounded
