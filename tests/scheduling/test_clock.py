"""The wall clock's sleeps notice a jump of the wall clock (a suspend, an NTP step) within one check."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from rockbot.clock import SystemClock

UTC = datetime.UTC


async def test_a_sleep_ends_soon_after_the_wall_clock_jumps_past_its_instant() -> None:
    wall = [datetime.datetime(2024, 5, 1, 10, 0, tzinfo=UTC)]
    clock = SystemClock(check_every=0.01, wall=lambda: wall[0])
    sleeper = asyncio.create_task(clock.sleep_until(wall[0] + datetime.timedelta(minutes=50)))
    await asyncio.sleep(0.05)
    assert not sleeper.done(), "the instant has not come on the wall clock"
    wall[0] += datetime.timedelta(minutes=50)  # the machine wakes from a suspend
    await asyncio.wait_for(sleeper, timeout=10)


def test_the_default_check_is_at_most_thirty_seconds_and_must_be_positive() -> None:
    with pytest.raises(ValueError, match="check_every=0 must be positive"):
        SystemClock(check_every=0)
    assert SystemClock.__init__.__kwdefaults__["check_every"] <= 30
