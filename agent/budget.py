"""The Agent's daily token budget (`spec.limits.tokensPerDay`) and the day's tally it is checked against.

Every model request's tokens count, from any loop of the process (turns, in-process helpers), for
the UTC day they were used in. A turn is admitted while the day's tally is below the budget; a turn
that started may use up the rest (the loop checks again before each model request and stops with a
message once it is used up), so the day can end over the budget by what the requests in flight at
that moment use.

One process knows its own use at once; the Agent's other replicas' (and its own before a restart)
it learns from the operator, which adds up every replica's reports and keeps the day's total in
`Agent.status.usage` (see `usage_reports`). The tally is therefore the last total the operator confirmed
plus what this process used since. A process that has never heard from the operator does not know
the day's total: with a budget it waits briefly for the first answer and then refuses turns,
naming the cause, rather than start spending a budget that may be gone. Without reports (`rockbot
local`, `--bus memory`, no bus) the process's own tally is the day's total.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable

from rockbot.agent.llm import Attempt, Usage

Clock = Callable[[], datetime.datetime]
#: How long a turn waits for the operator's first total before it is refused.
FIRST_TOTAL_SECONDS = 10.0


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class BudgetExhausted(Exception):
    """No turn now: the day's tokens are used up (or the day's total is unknown)."""

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class TokenBudget:
    """The day's tally of one agent process and the budget it is checked against (None: no budget)."""

    def __init__(
        self,
        *,
        tokens_per_day: int | None,
        reported: bool = False,
        clock: Clock = utc_now,
        first_total_seconds: float = FIRST_TOTAL_SECONDS,
    ) -> None:
        self.limit = tokens_per_day
        self._clock = clock
        self._first_total_seconds = first_total_seconds
        self._day = clock().date()
        self._confirmed = Usage()  # the agent's total today, as the operator last confirmed it (all replicas)
        self._in_flight = Usage()  # this process's tokens in a report not answered yet
        self._unsent = Usage()  # this process's tokens not reported yet
        self._known = asyncio.Event()  # the day's total is known (at once when nobody else reports)
        if not reported:
            self._known.set()
        #: Set whenever tokens are counted (the reports to the operator wait for it).
        self.recorded = asyncio.Event()

    @property
    def day(self) -> datetime.date:
        self._roll()
        return self._day

    def used(self) -> Usage:
        """Today's tokens as far as this process knows."""
        self._roll()
        return self._confirmed + self._in_flight + self._unsent

    def record(self, attempt: Attempt) -> None:
        """An observer of the model client: count what a request used."""
        if attempt.usage is not None:
            self._roll()
            self._unsent = self._unsent + attempt.usage
            self.recorded.set()

    async def admit(self) -> None:
        """Return when a turn (or its next model request) may go on; `BudgetExhausted` when it may not."""
        if self.limit is None:
            return
        if not self._known.is_set():
            try:
                async with asyncio.timeout(self._first_total_seconds):
                    await self._known.wait()
            except TimeoutError:
                raise BudgetExhausted(
                    "this agent has a daily token budget (spec.limits.tokensPerDay), and today's usage over all "
                    "its replicas is not known yet: the operator has not answered this replica's usage report. "
                    "Try again shortly; if it persists, check that the operator is running and connected to the bus",
                    retry_after_seconds=30,
                ) from None
        used = self.used().total_tokens
        if used >= self.limit:
            raise BudgetExhausted(
                f"this agent's daily token budget is used up: {used} of {self.limit} tokens today (UTC). It resets "
                "at midnight UTC; raise spec.limits.tokensPerDay on the Agent to allow more",
                retry_after_seconds=self.seconds_to_midnight(),
            )

    def seconds_to_midnight(self) -> int:
        now = self._clock()
        midnight = datetime.datetime.combine(now.date() + datetime.timedelta(days=1), datetime.time(), now.tzinfo)
        return max(1, int((midnight - now).total_seconds()))

    # -- what the reports to the operator use --------------------------------------------------

    def take_unsent(self) -> tuple[datetime.date, Usage]:
        """The tokens to report now (they count as in flight until `confirm` or `unconfirmed`)."""
        self._roll()
        self._in_flight, self._unsent = self._in_flight + self._unsent, Usage()
        return self._day, self._in_flight

    def confirm(self, *, day: datetime.date, total: Usage) -> None:
        """The operator's total for `day`, which includes every report this process had in flight."""
        self._roll()
        if day == self._day:
            self._confirmed, self._in_flight = total, Usage()
            self._known.set()

    def unconfirmed(self) -> None:
        """The report in flight got no answer: its tokens go out again with the next one."""
        self._in_flight, self._unsent = Usage(), self._unsent + self._in_flight

    def _roll(self) -> None:
        today = self._clock().date()
        if today != self._day:  # a new day: nothing used yet, and yesterday's unreported use is yesterday's
            self._day = today
            self._confirmed = self._in_flight = self._unsent = Usage()
