"""A coalescing work queue: keys to reconcile, a bounded number at a time, each key once at a time.

Events only say "look at this key again". A key added while it waits is not added twice; a key
added while it runs runs once more afterwards (it may have missed the news); so a burst of events
for one Agent costs one or two reconciles, never one per event. A fixed number of workers bounds
how many reconciles, and so how many API requests, are in flight: the event loop and the
connection pool are never swamped, and a request's time is spent on the wire, not in a queue.
A failed key is tried again after a pause that doubles with each failure (up to five minutes, with
a little jitter so keys that failed together do not come back together), unless an event brings it
back sooner; and retries start at most `retries_per_second` at a time across all keys. So a cause
that fails every Agent at once (a Service range full, a quota, a webhook down) costs a bounded number
of requests per minute however many Agents there are, where a pause per key alone let 250 failing
Agents make 9,301 requests in four minutes. News (an event, the resync) is never held back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Hashable

from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: The pause before a failed key is tried again the first time; it doubles with each failure, up to the last.
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 300.0
#: Retries (not news) started per second across all keys.
RETRIES_PER_SECOND = 2.0
#: Each pause is stretched by up to this fraction at random.
JITTER = 0.1


class WorkQueue:
    """`add(key)` from anywhere on the loop; `work(key)` runs in one of `workers` tasks once `start()`ed."""

    def __init__(
        self,
        work: Callable[[Hashable], Awaitable[None]],
        *,
        workers: int,
        first_retry: float = FIRST_RETRY_SECONDS,
        max_retry: float = MAX_RETRY_SECONDS,
        retries_per_second: float = RETRIES_PER_SECOND,
    ) -> None:
        self._work = work
        self._workers = workers
        self._first_retry = first_retry
        self._max_retry = max_retry
        self._retry_spacing = 1.0 / retries_per_second
        self._queued: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._running: set[Hashable] = set()
        self._again: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        #: Failed keys by the loop time they are due again, and the same as a heap (stale entries skipped).
        self._retries: dict[Hashable, float] = {}
        self._due: list[tuple[float, int, Hashable]] = []
        self._pushed = itertools.count()
        #: The one timer that releases due retries, one per `_retry_spacing` at most, and when it last did.
        self._pacer: asyncio.TimerHandle | None = None
        self._released_at = -math.inf
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: Hashable) -> None:
        """Reconcile `key` soon: once, however often it is added before a worker takes it."""
        self._retries.pop(key, None)  # news: no need to wait for the retry
        if key in self._running:
            self._again.add(key)
        elif key not in self._queued:
            self._queued[key] = None
            self._ready.set()
        self._idle.clear()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"reconcile worker {n}") for n in range(self._workers)]

    async def stop(self) -> None:
        if self._pacer is not None:
            self._pacer.cancel()
            self._pacer = None
        self._retries.clear()
        self._due.clear()
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()

    async def idle(self) -> None:
        """Until nothing is queued or running (retries waiting for their pause do not count)."""
        await self._idle.wait()

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

    def __contains__(self, key: Hashable) -> bool:
        """Whether `key` waits for a worker: queued, or to run again once its current run ends."""
        return key in self._queued or key in self._again

    async def _worker(self) -> None:
        while True:
            while not self._queued:
                self._ready.clear()
                await self._ready.wait()
            key, _ = self._queued.popitem(last=False)
            self._running.add(key)
            try:
                await self._work(key)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self._schedule_retry(key, error)
            else:
                self._failures.pop(key, None)
            finally:
                self._running.discard(key)
            if key in self._again:
                self._again.discard(key)
                self.add(key)
            if not self._queued and not self._running:
                self._idle.set()

    def _schedule_retry(self, key: Hashable, error: Exception) -> None:
        attempt = self._failures.get(key, 0)
        self._failures[key] = attempt + 1
        if key in self._again:
            log.warning("reconcile of %s failed (%s); news arrived meanwhile, trying again now", _describe(key), error)
            return
        pause = min(self._first_retry * 2 ** min(attempt, 32), self._max_retry) * (1 + JITTER * random.random())
        log.warning("reconcile of %s failed (%s); retrying in %.0fs or later", _describe(key), error, pause)
        due = self._retries[key] = asyncio.get_running_loop().time() + pause
        heapq.heappush(self._due, (due, next(self._pushed), key))
        self._pace()

    def _pace(self) -> None:
        """Set the pacer for the earliest due retry, no sooner than `_retry_spacing` after the last one."""
        if self._pacer is not None:
            self._pacer.cancel()
            self._pacer = None
        while self._due and self._retries.get(self._due[0][2]) != self._due[0][0]:
            heapq.heappop(self._due)  # news took it meanwhile, or it failed again since
        if self._due:
            at = max(self._due[0][0], self._released_at + self._retry_spacing)
            self._pacer = asyncio.get_running_loop().call_at(at, self._release)

    def _release(self) -> None:
        """Add the earliest due retry to the queue (timers run late, never early: this one checks the spacing)."""
        self._pacer = None
        now = asyncio.get_running_loop().time()
        if self._due and now >= self._released_at + self._retry_spacing:
            due, _, key = self._due[0]
            if self._retries.get(key) == due and due <= now:
                heapq.heappop(self._due)
                del self._retries[key]
                self._released_at = now
                with contextlib.suppress(RuntimeError):  # the loop is closing
                    self.add(key)
        self._pace()


def _describe(key: Hashable) -> str:
    if isinstance(key, tuple) and len(key) == 3:
        kind, namespace, name = key
        return f"{kind} {namespace}/{name}"
    return repr(key)
