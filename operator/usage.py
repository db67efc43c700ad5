"""Each Agent's token usage for the day: the agents' reports added up, kept in `Agent.status.usage`.

Agent pods have no Kubernetes rights, so every agent process reports the tokens it used to the
operator over the bus (`operator.usage`, see `rockbot.contracts.usage`); who used them is the
report's sender (its broker-validated `user_id`). The operator adds the reports of all the Agent's
replicas to the day's total, which it starts from the Agent's `status.usage` the first time it hears
of the Agent, so a restart loses nothing written. It answers each report at once with the total
(the replicas check the daily budget against it), and writes the totals that changed in one status
patch per Agent every `flush_seconds`; a report is acked only after the write that holds it (or one
that failed: that total is written again at the next flush), so an operator that stops before
writing gets the report again from the broker. A report acked after a write can come again only if
the operator stopped between the two: it is then counted twice, which errs on the side of the budget.
A report of a day older than the total's is dropped; a newer day starts the total afresh.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass

from rockbot.bus import BadMessage, Bus, Delivery, Principal, Refused, Subscription
from rockbot.bus.topology import OPERATOR_USAGE, agent_replies_prefix
from rockbot.contracts.usage import MAX_REPORT_BYTES, UsageReport, UsageTotal
from rockbot.kube import AGENTS, ApiError, KubeClient, NotFound
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FLUSH_SECONDS = 5.0
#: How long a stopping operator lets the reports its last write holds be acked.
STOP_DRAIN_SECONDS = 1.0
#: How many reports wait for their write at once (one per agent process that reported since the last one).
PREFETCH = 256


@dataclass
class _Day:
    day: datetime.date
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dirty: bool = False

    def add(self, report: UsageReport) -> None:
        if report.day > self.day:
            self.day, self.prompt_tokens, self.completion_tokens = report.day, 0, 0
        if report.day == self.day:
            self.prompt_tokens += report.prompt_tokens
            self.completion_tokens += report.completion_tokens
            self.dirty = True

    def total(self) -> UsageTotal:
        return UsageTotal(day=self.day, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    def status(self) -> dict[str, object]:
        return {"day": self.day.isoformat(), "promptTokens": self.prompt_tokens,
                "completionTokens": self.completion_tokens, "totalTokens": self.prompt_tokens + self.completion_tokens}


class UsageLedger:
    """Consumes `operator.usage`; `start()` and `stop()` with the operator's bus connection."""

    def __init__(self, *, kube: KubeClient, bus: Bus, flush_seconds: float = FLUSH_SECONDS) -> None:
        self._kube = kube
        self._bus = bus
        self._flush_seconds = flush_seconds
        self._days: dict[tuple[str, str], _Day] = {}
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}
        self._written: asyncio.Future[None] | None = None
        self._subscription: Subscription | None = None
        self._flusher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_forever(), name="write agents' token usage")
        self._subscription = await self._bus.consume(queue=OPERATOR_USAGE, handler=self.handle, prefetch=PREFETCH)

    async def stop(self) -> None:
        """Write what is held and ack its reports; the reports not yet written come back to the next operator."""
        await cancel_and_wait(self._flusher)
        await self.flush()
        if self._subscription is not None:
            await self._subscription.close(drain_seconds=STOP_DRAIN_SECONDS)

    async def handle(self, delivery: Delivery) -> None:
        sender = _reporting_agent(delivery)
        try:
            report = delivery.decode(UsageReport, max_bytes=MAX_REPORT_BYTES)
        except BadMessage as exc:
            raise Refused(f"an unreadable usage report: {exc}") from None
        day = await self._day_of(sender, report.day)
        if day is None:  # no such Agent (deleted): nothing to count it for
            raise Refused(f"{sender} reported usage, but its Agent does not exist")
        day.add(report)
        written = self._next_write()
        await self._bus.reply(to=delivery, body=day.total())
        await asyncio.shield(written)  # acked only once the total that holds it is in the status

    def _next_write(self) -> asyncio.Future[None]:
        if self._written is None or self._written.done():
            self._written = asyncio.get_running_loop().create_future()
        return self._written

    async def flush(self) -> None:
        """Write every total that changed (one merge patch per Agent), then release the reports it holds."""
        written, self._written = self._written, None
        for (namespace, name), day in list(self._days.items()):
            if not day.dirty:
                continue
            day.dirty = False
            try:
                await self._kube.patch(AGENTS, namespace=namespace, name=name, subresource="status",
                                       body={"status": {"usage": day.status()}})
            except NotFound:
                self._days.pop((namespace, name), None)
            except (ApiError, OSError) as exc:  # kept for the next flush
                day.dirty = True
                log.warning("could not write the token usage of Agent %s/%s (will try again): %s", namespace, name, exc)
        if written is not None and not written.done():
            written.set_result(None)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            await self.flush()

    async def _day_of(self, agent: Principal, day: datetime.date) -> _Day | None:
        """The Agent's running total, read from its status the first time (None: no such Agent)."""
        key = (agent.namespace, agent.name)
        async with self._loading.setdefault(key, asyncio.Lock()):
            if key not in self._days:
                try:
                    body = await self._kube.get(AGENTS, namespace=agent.namespace, name=agent.name)
                except NotFound:
                    return None
                self._days[key] = _from_status(body, today=day)
            return self._days[key]


def _from_status(body: dict, *, today: datetime.date) -> _Day:
    usage = (body.get("status") or {}).get("usage") or {}
    try:
        written = datetime.date.fromisoformat(usage.get("day", ""))
    except ValueError:
        return _Day(day=today)
    return _Day(day=written, prompt_tokens=int(usage.get("promptTokens") or 0),
                completion_tokens=int(usage.get("completionTokens") or 0))


def _reporting_agent(delivery: Delivery) -> Principal:
    """The agent that sent the report, when the answer can go to one of its own queues; else `Refused`."""
    sender = delivery.sender
    if sender is None or sender.kind != "agent":
        raise Refused(f"usage reports come from agents, not from {delivery.user_id}")
    if delivery.agent_answered_on_own(lambda agent: agent_replies_prefix(namespace=agent.namespace,
                                                                            name=agent.name)) is None:  # fmt: skip
        raise Refused(f"{sender} asked for its usage total on {delivery.reply_to!r}, not one of its own queues")
    return sender
