"""The work queue's retries: a failing key waits longer each time, and all failing keys together are paced.

Only lower bounds are checked (a timer never runs early), so a loaded machine cannot fail these.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable

from rockbot.operator.workqueue import WorkQueue

FIRST = 0.02


class Failing:
    """Work that always fails, as a reconcile does when the API server refuses a child; records when it ran."""

    def __init__(self, *, until: int) -> None:
        self.attempts: dict[Hashable, list[float]] = {}
        self.until = until
        self.enough = asyncio.Event()

    async def __call__(self, key: Hashable) -> None:
        self.attempts.setdefault(key, []).append(asyncio.get_running_loop().time())
        if sum(len(times) for times in self.attempts.values()) >= self.until:
            self.enough.set()
        raise RuntimeError("the API server answered 403 Forbidden: exceeded quota")


async def run_until_enough(work: Failing, queue: WorkQueue, keys: list[str]) -> None:
    queue.start()
    for key in keys:
        queue.add(key)
    try:
        async with asyncio.timeout(30):  # waits for: `work.until` attempts in all
            await work.enough.wait()
    finally:
        await queue.stop()


async def test_a_failing_key_is_tried_again_after_pauses_that_double_up_to_the_cap():
    work = Failing(until=6)
    queue = WorkQueue(work, workers=2, first_retry=FIRST, max_retry=8 * FIRST, retries_per_second=1000)
    await run_until_enough(work, queue, ["agent"])
    gaps = [later - earlier for earlier, later in itertools.pairwise(work.attempts["agent"])]
    assert [gap >= FIRST * want for gap, want in zip(gaps, [1, 2, 4, 8, 8], strict=True)] == [True] * 5, gaps


async def test_failing_keys_are_retried_at_a_bounded_rate_however_many_there_are():
    rate, keys = 10.0, [f"agent-{index}" for index in range(10)]
    work = Failing(until=20)  # every key once, then retried once
    queue = WorkQueue(work, workers=8, first_retry=FIRST, max_retry=FIRST, retries_per_second=rate)
    await run_until_enough(work, queue, keys)
    retries = sorted(times[1] for times in work.attempts.values())
    assert len(retries) == len(keys)
    # Released one per 1/rate s at most, across keys (a worker may take one a little later: one spacing spare).
    assert retries[-1] - retries[0] >= (len(keys) - 2) / rate, retries


async def test_news_for_a_failing_key_runs_it_at_once():
    work = Failing(until=1)
    queue = WorkQueue(work, workers=1, first_retry=3600, retries_per_second=1)
    queue.start()
    try:
        queue.add("agent")
        async with asyncio.timeout(10):  # waits for: the first attempt
            await work.enough.wait()
        work.enough.clear()
        work.until = 2
        queue.add("agent")  # an event: the hour's pause is not waited for
        async with asyncio.timeout(10):  # waits for: the second attempt, brought by the news
            await work.enough.wait()
    finally:
        await queue.stop()
    assert len(work.attempts["agent"]) == 2
