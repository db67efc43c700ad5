"""The fair share of sandboxes: a cap per agent, and round robin between agents when all are busy."""

from __future__ import annotations

import asyncio

import pytest

from rockbot.scripts_manager.sharing import FairShare


async def test_a_freed_sandbox_goes_to_the_agent_served_least_recently_and_no_agent_exceeds_its_cap() -> None:
    share = FairShare(total=2, per_agent=2)
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("a1", "a2", "a3", "a4", "b1", "c1")}

    async def run(name: str) -> None:
        async with share.slot(name[0]):
            order.append(name)
            await release[name].wait()

    tasks = [asyncio.create_task(run(name)) for name in ("a1", "a2", "a3", "a4", "b1", "c1")]
    await asyncio.sleep(0)
    assert order == ["a1", "a2"] and share.running("a") == 2  # a came first and may use both
    release["a1"].set()
    await asyncio.sleep(0.01)
    assert order[-1] == "b1"  # not a3: b has waited without being served
    release["a2"].set()
    await asyncio.sleep(0.01)
    assert order[-1] == "c1"
    for event in release.values():
        event.set()
    await asyncio.gather(*tasks)
    assert order == ["a1", "a2", "b1", "c1", "a3", "a4"]


async def test_one_agent_alone_runs_no_more_than_its_share_and_a_cancelled_wait_frees_nothing_it_did_not_hold() -> None:
    share = FairShare(total=4, per_agent=1)
    gate = asyncio.Event()
    started: list[int] = []

    async def run(n: int) -> None:
        async with share.slot("a"):
            started.append(n)
            await gate.wait()

    tasks = [asyncio.create_task(run(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert started == [0] and share.running("a") == 1
    tasks[1].cancel()
    await asyncio.sleep(0.01)
    assert started == [0] and share.running("a") == 1
    gate.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert started == [0, 2] and share.running("a") == 0


def test_a_share_needs_room_for_one_script() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairShare(total=0, per_agent=1)
