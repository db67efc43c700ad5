"""Run the work of one request once, however often its message arrives.

A broker redelivers a message whose consumer died before acking (possibly after its reply went
out), and a sender may publish twice. A consumer keeps a `RunOnce` keyed by whatever names one
request (for example the sender and its request id): a copy that arrives while the first is being
handled joins that run; a copy that arrives after it gets the remembered result. A `fingerprint`
of the work tells a true copy from a different request reusing the key: that one gets `Conflict`
instead of somebody else's answer. Memory is bounded to the most recent keys; a run that fails or
is cancelled is not remembered, so a later copy tries again.

A run is a task of its own, not part of its caller: a caller cancelled because its delivery was
lost with the broker connection leaves the run going, and the redelivered copy joins it. Only
`cancel_all()` (shutting down) stops runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_REMEMBERED = 1024


class Conflict(Exception):
    """A request reuses the key of another one in flight or remembered, with different work."""


class RunOnce(Generic[T]):
    def __init__(self, *, remember: int = DEFAULT_REMEMBERED) -> None:
        if remember < 1:
            raise ValueError(f"remember={remember} must be at least 1 (how many finished ids to keep)")
        self._remember = remember
        self._running: dict[Hashable, tuple[str, asyncio.Task[T]]] = {}
        self._done: OrderedDict[Hashable, tuple[str, T]] = OrderedDict()

    async def run(self, *, key: Hashable, work: Callable[[], Awaitable[T]], fingerprint: str = "") -> T:
        """`work()`'s result for `key`, calling it only if no run for `key` is in flight or remembered.

        `Conflict` if the run in flight or remembered for `key` had another `fingerprint`.
        """
        if (done := self._done.get(key)) is not None:
            _check_same(key=key, had=done[0], has=fingerprint)
            log.info("%s was handled before; answering with the same result", key)
            return done[1]
        if (running := self._running.get(key)) is not None:
            _check_same(key=key, had=running[0], has=fingerprint)
            log.info("%s is being handled; waiting for that run", key)
            return await asyncio.shield(running[1])
        task = asyncio.create_task(self._remembered(key=key, fingerprint=fingerprint, work=work))
        task.add_done_callback(lambda finished: self._finished(key=key, task=finished))
        self._running[key] = (fingerprint, task)
        return await asyncio.shield(task)  # a caller cancelled must not cancel the run

    def knows(self, key: Hashable) -> bool:
        """Whether a run for `key` is in flight or remembered (a copy of it would start no new work)."""
        return key in self._running or key in self._done

    async def cancel_all(self) -> None:
        """Stop every run in flight; whoever waits on one is cancelled too (their copies get redelivered)."""
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _remembered(self, *, key: Hashable, fingerprint: str, work: Callable[[], Awaitable[T]]) -> T:
        result = await work()
        self._done[key] = (fingerprint, result)
        while len(self._done) > self._remember:
            self._done.popitem(last=False)
        return result

    def _finished(self, *, key: Hashable, task: asyncio.Task[T]) -> None:
        """However the run ended (even cancelled before it began), it is no longer in flight."""
        running = self._running.get(key)
        if running is not None and running[1] is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # whoever awaited the run has seen it; nobody else needs the warning


def _check_same(*, key: Hashable, had: str, has: str) -> None:
    if had != has:
        raise Conflict(f"{key} was already used for a different request")
