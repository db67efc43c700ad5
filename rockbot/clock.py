"""Time as a dependency: the scheduler and the gateway read and sleep on a `Clock`, so tests can drive it.

`SystemClock` is the real one; `ManualClock` only moves when told to and wakes every sleeper whose
instant has come, so daylight-saving transitions and days of downtime take no real time in tests.
"""

from __future__ import annotations

import asyncio
import datetime
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

UTC = datetime.UTC


class Clock(Protocol):
    def now(self) -> datetime.datetime:
        """The current instant, timezone-aware in UTC."""
        ...

    async def sleep_until(self, instant: datetime.datetime) -> None:
        """Return at (or soon after) `instant`; at once if it has passed."""
        ...


class SystemClock:
    """The wall clock, re-read at least every `check_every` seconds while sleeping.

    `asyncio.sleep` runs on the monotonic clock, which stands still while the machine is suspended
    and ignores steps of the wall clock (NTP, a VM restored); re-checking in short chunks bounds how
    late such a jump can make a slot fire, and never lets it fire early.
    """

    def __init__(self, *, check_every: float = 30.0, wall: Callable[[], datetime.datetime] | None = None) -> None:
        if check_every <= 0:
            raise ValueError(f"check_every={check_every} must be positive (seconds between wall-clock checks)")
        self._check_every = check_every
        self._wall = wall or (lambda: datetime.datetime.now(UTC))

    def now(self) -> datetime.datetime:
        return self._wall()

    async def sleep_until(self, instant: datetime.datetime) -> None:
        remaining = (instant - self.now()).total_seconds()
        while remaining > 0:
            await asyncio.sleep(min(remaining, self._check_every))
            remaining = (instant - self.now()).total_seconds()


class ManualClock:
    """A clock that stands still until `advance()` or `set()`; sleepers wake in instant order."""

    def __init__(self, start: datetime.datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("start must be timezone-aware, e.g. datetime.datetime(2024, 3, 10, tzinfo=datetime.UTC)")
        self._now = start.astimezone(UTC)
        self._sleepers: list[tuple[datetime.datetime, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> datetime.datetime:
        return self._now

    async def sleep_until(self, instant: datetime.datetime) -> None:
        if instant <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (instant, next(self._order), future))
        await future

    def set(self, instant: datetime.datetime) -> None:
        """Move to `instant` (never backwards) and wake whoever slept until then."""
        instant = instant.astimezone(UTC)
        if instant < self._now:
            raise ValueError(f"a ManualClock does not go back: {instant.isoformat()} < {self._now.isoformat()}")
        self._now = instant
        while self._sleepers and self._sleepers[0][0] <= instant:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def advance(self, seconds: float) -> None:
        self.set(self._now + datetime.timedelta(seconds=seconds))

    @property
    def next_wakeup(self) -> datetime.datetime | None:
        """The earliest instant someone sleeps until (benchmarks step the clock from one to the next)."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None
