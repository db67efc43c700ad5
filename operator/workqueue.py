"""A coalescing work queue: keys to reconcile, a bounded number at a time, each key once at a time.

Events only say "look at this key again". A key added while it waits is not added twice; a key
added while it runs runs once more afterwards (it may have missed the news); so a burst of events
for one Agent costs one or two reconciles, never one per event. A fixed number of workers bounds
how many reconciles, and so how many API requests, are in flight: the event loop and the
connection pool are never swamped, and a request's time is spent on the wire, not in a queue.
A failed key is tried again after a growing pause (unless an event brings it back sooner).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)

#: Pauses before a failed key is tried again; the last one repeats.
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class WorkQueue:
    """`add(key)` from anywhere on the loop; `work(key)` runs in one of `workers` tasks once `start()`ed."""

    def __init__(self, work: Callable[[Hashable], Awaitable[None]], *, workers: int) -> None:
        self._work = work
        self._workers = workers
        self._queued: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._running: set[Hashable] = set()
        self._again: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._retries: dict[Hashable, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: Hashable) -> None:
        """Reconcile `key` soon: once, however often it is added before a worker takes it."""
        retry = self._retries.pop(key, None)
        if retry is not None:
            retry.cancel()
        if key in self._running:
            self._again.add(key)
        elif key not in self._queued:
            self._queued[key] = None
            self._ready.set()
        self._idle.clear()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"reconcile worker {n}") for n in range(self._workers)]

    async def stop(self) -> None:
        for retry in self._retries.values():
            retry.cancel()
        self._retries.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def idle(self) -> None:
        """Until nothing is queued or running (retries waiting for their pause do not count)."""
        await self._idle.wait()

    def __len__(self) -> int:
        return len(self._queued) + len(self._running)

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
        delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
        log.warning("reconcile of %s failed (%s); retrying in %gs", _describe(key), error, delay)
        if key in self._again:
            return  # news arrived meanwhile: it runs again at once anyway
        loop = asyncio.get_running_loop()
        self._retries[key] = loop.call_later(delay, self._retry, key)

    def _retry(self, key: Hashable) -> None:
        self._retries.pop(key, None)
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self.add(key)


def _describe(key: Hashable) -> str:
    if isinstance(key, tuple) and len(key) == 3:
        kind, namespace, name = key
        return f"{kind} {namespace}/{name}"
    return repr(key)
