"""`RunOnce`: one run per id; failures are not remembered; memory stays bounded."""

from __future__ import annotations

import pytest

from rockbot.bus.once import RunOnce


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
