"""The console's bus side: write agents' run events to the store, and answer their session-history requests.

Writing (`console.runs`): each message's agent is its broker-validated sender, never a field of the body; a
sender that is no agent is refused, and so is a message with an event of a run that is not the sender's own: a
run id starts with its agent's prefix (`rockbot.contracts.recording.new_run_id`), so no agent can claim
another's run, even one whose id it learned, and take it out of that agent's record. Messages are gathered for
a moment (`linger_seconds`, at most `max_batch` messages) and written in one transaction; each message is
acked only after that commit, so a writer killed mid-batch leaves its messages to be redelivered and written
again, once (the store writes each event once). While the database is unreachable the batch is retried, never
dropped, the messages stay unacked (the prefetch bounds how many) and readiness says why. Each agent is
bounded: a message over `MAX_BATCH_BYTES` is refused unread, and an agent past its rate (`events_per_second`,
with a burst of `burst_events`) has its messages refused and counted, so one agent cannot flood the store or
crowd out the others.

History (`console.history`): an agent gets the messages of its own runs only (the conversation key:
the sender agent, the caller it names, the session id), or one chunk of that conversation's working
memory, answered on its own reply queue; at most `HISTORY_PER_AGENT` of one agent's requests at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel

from rockbot.bus import Bus, Delivery, Refused, Subscription
from rockbot.bus.identity import Principal
from rockbot.bus.topology import CONSOLE_HISTORY, CONSOLE_RUNS
from rockbot.console.agent_requests import AgentRequests
from rockbot.console.store import Batch, Store, StoreUnavailable
from rockbot.contracts.recording import MAX_BATCH_BYTES, HistoryRequest, RunEvents, owns_run, run_id_prefix
from rockbot.health import Readiness
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Pauses between attempts to write a batch while the database is unreachable; the last one repeats.
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)
_HISTORY_REQUEST_BYTES = 4096
#: History requests of one agent answered at once (`InFlight`); its others are refused meanwhile (its turn goes on
#: with what its process holds), so one agent's flood of them never stands before another agent's.
HISTORY_PER_AGENT = 4


@dataclass(frozen=True, kw_only=True)
class WriterLimits:
    """How much the writer takes at once, and from one agent."""

    max_batch: int = 200
    linger_seconds: float = 0.02
    prefetch: int = 400
    events_per_second: float = 500.0
    burst_events: float = 5000.0


class RecorderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter("rockbot_console_events_total", "Run events received, by what became of them "
                              "(written, duplicate, refused_owner, refused_rate).", ["result"], registry=registry)
        self.batches = Histogram("rockbot_console_write_seconds", "Time one batch's transaction took.",
                                 registry=registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.unavailable = Counter("rockbot_console_store_unavailable_total",
                                   "Batches that found the database unreachable (and were retried).", registry=registry)
        self.history = Counter("rockbot_console_history_requests_total", "Session-history requests answered.",
                               registry=registry)  # fmt: skip


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class _Pending:
    batch: Batch
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class RunWriter:
    """Consumes `console.runs` and writes what it reads in batches; `start()`, then `stop()`."""

    def __init__(
        self,
        *,
        store: Store,
        bus: Bus,
        readiness: Readiness,
        metrics: RecorderMetrics,
        limits: WriterLimits | None = None,
    ) -> None:
        self._store = store
        self._bus = bus
        self._readiness = readiness
        self._metrics = metrics
        self._limits = limits or WriterLimits()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._buckets: dict[Principal, _Bucket] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_forever(), name="run-writer")
        self._subscription = await self._bus.consume(
            queue=CONSOLE_RUNS, handler=self._on_events, prefetch=self._limits.prefetch
        )

    async def stop(self, *, drain_seconds: float = 2.0) -> None:
        """Stop taking messages; what is written by then is acked, the rest is redelivered later."""
        if self._subscription is not None:
            await self._subscription.close(drain_seconds=drain_seconds)
            self._subscription = None
        await cancel_and_wait(self._flusher)
        self._flusher = None

    async def _on_events(self, delivery: Delivery) -> None:
        sender = delivery.sender
        if sender is None or sender.kind != "agent":
            raise Refused(f"run events come from agents only, not from {delivery.user_id!r}")
        events = delivery.decode(RunEvents, max_bytes=MAX_BATCH_BYTES).events
        foreign = {e.run_id for e in events if not owns_run(e.run_id, namespace=sender.namespace, agent=sender.name)}
        if foreign:
            self._metrics.events.labels("refused_owner").inc(len(events))
            raise Refused(f"{sender} sent events of runs whose ids are not its own ({len(foreign)}, e.g. "
                          f"{sorted(foreign)[0]!r}): an agent's run ids start with its own prefix "
                          f"{run_id_prefix(namespace=sender.namespace, agent=sender.name)!r}; nothing recorded")
        if not self._admit(sender, len(events)):
            self._metrics.events.labels("refused_rate").inc(len(events))
            raise Refused(
                f"{sender} sent run events faster than {self._limits.events_per_second:g}/s "
                f"(burst {self._limits.burst_events:g}): {len(events)} events not recorded"
            )
        pending = _Pending(batch=Batch(namespace=sender.namespace, agent=sender.name, events=events))
        await self._queue.put(pending)
        await pending.done  # acked (by returning) only once its transaction committed

    def _admit(self, sender: Principal, count: int) -> bool:
        now = time.monotonic()
        bucket = self._buckets.setdefault(sender, _Bucket(tokens=self._limits.burst_events, updated=now))
        bucket.tokens = min(self._limits.burst_events,
                            bucket.tokens + (now - bucket.updated) * self._limits.events_per_second)  # fmt: skip
        bucket.updated = now
        if bucket.tokens < count:
            return False
        bucket.tokens -= count
        return True

    async def _flush_forever(self) -> None:
        while True:
            pending = [await self._queue.get()]
            deadline = asyncio.get_running_loop().time() + self._limits.linger_seconds
            while len(pending) < self._limits.max_batch:
                remaining = deadline - asyncio.get_running_loop().time()
                try:
                    async with asyncio.timeout(max(remaining, 0)):
                        pending.append(await self._queue.get())
                except TimeoutError:
                    break
            await self._write(pending)

    async def _write(self, pending: list[_Pending]) -> None:
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                written = await self._store.write(batches=[p.batch for p in pending])
            except StoreUnavailable as exc:
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                self._metrics.unavailable.inc()
                self._readiness.waiting("database", f"{exc} (attempt {attempt}, next in {delay:g} s)")
                log.warning("the run store is unreachable (%s); %d messages wait, next try in %g s",
                            exc, len(pending), delay)  # fmt: skip
                await asyncio.sleep(delay)
                continue
            self._readiness.done("database")
            self._metrics.batches.observe(time.perf_counter() - started)
            self._metrics.events.labels("written").inc(written.written)
            self._metrics.events.labels("duplicate").inc(written.duplicates)
            self._metrics.events.labels("refused_owner").inc(written.refused)
            for each in pending:
                if not each.done.done():
                    each.done.set_result(None)
            return


class HistoryAnswerer(AgentRequests):
    """Answers `HistoryRequest`s on `console.history` from the asking agent's own runs."""

    what, queue, prefetch, per_agent = "history", CONSOLE_HISTORY, 16, HISTORY_PER_AGENT
    max_bytes, request_type = _HISTORY_REQUEST_BYTES, HistoryRequest

    def __init__(self, *, store: Store, bus: Bus, metrics: RecorderMetrics) -> None:
        super().__init__(bus=bus)
        self._store = store
        self._metrics = metrics

    async def answer(self, agent: Principal, request: HistoryRequest) -> BaseModel | None:
        conversation = {"namespace": agent.namespace, "agent": agent.name, "caller": request.caller,
                        "session_id": request.session_id}  # fmt: skip
        try:
            if request.memory_key:
                reply: BaseModel = await self._store.session_memory(**conversation, key=request.memory_key)
            else:
                reply = await self._store.session_history(**conversation, max_messages=request.max_messages)
        except StoreUnavailable as exc:  # the agent falls back to what it holds; an empty answer would erase that
            log.warning("cannot answer %s's history request: %s", agent, exc)
            return None
        self._metrics.history.inc()
        return reply
