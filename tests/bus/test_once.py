"""`RunOnce`: one run per key; failures are not remembered; other work under a key conflicts; memory stays bounded."""

from __future__ import annotations

import asyncio

import pytest

from rockbot.bus.once import Conflict, RunOnce


async def test_a_failed_run_is_not_remembered_so_a_later_copy_runs_again() -> None:
    once: RunOnce[str] = RunOnce()
    runs: list[str] = []

    async def flaky() -> str:
        runs.append("x")
        if len(runs) == 1:
            raise RuntimeError("first try fails")
        return "done"

    with pytest.raises(RuntimeError, match="first try"):
        await once.run(key="r1", work=flaky)
    assert await once.run(key="r1", work=flaky) == "done"
    assert await once.run(key="r1", work=flaky) == "done"
    assert len(runs) == 2


async def test_only_the_most_recent_ids_are_remembered() -> None:
    once: RunOnce[int] = RunOnce(remember=2)
    runs: list[int] = []

    async def work() -> int:
        runs.append(1)
        return len(runs)

    for key in ("a", "b", "c", "a"):  # "a" was pushed out by "c", so it runs again
        await once.run(key=key, work=work)
    assert len(runs) == 4
    assert await once.run(key="c", work=work) == 3 and len(runs) == 4


def test_remembering_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="remember=0"):
        RunOnce(remember=0)


async def test_other_work_under_a_key_in_flight_or_remembered_conflicts() -> None:
    once: RunOnce[str] = RunOnce()
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "first"

    first = asyncio.create_task(once.run(key=("alice", "r1"), fingerprint="a", work=slow))
    await started.wait()  # the first run is in flight from here on
    with pytest.raises(Conflict, match="already used"):
        await once.run(key=("alice", "r1"), fingerprint="b", work=slow)
    release.set()
    assert await first == "first"
    with pytest.raises(Conflict):
        await once.run(key=("alice", "r1"), fingerprint="b", work=slow)
    assert await once.run(key=("alice", "r1"), fingerprint="a", work=slow) == "first"
