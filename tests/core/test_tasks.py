"""Stopping background tasks: every one ends, and the task that stops them can still be stopped itself."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rockbot.tasks import cancel_and_wait


async def _slow_to_stop(stopping: asyncio.Event) -> None:
    """Runs until cancelled, then takes a moment to clean up (as closing a connection does)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.sleep(0.2)
        raise


async def test_every_task_has_ended_when_it_returns() -> None:
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(_slow_to_stop(stopping)) for _ in range(3)]
    await asyncio.sleep(0)
    await cancel_and_wait(*tasks)
    assert all(task.cancelled() for task in tasks)


async def test_the_stopping_task_stays_cancellable_while_it_waits() -> None:
    """`with suppress(CancelledError): await task` also swallowed a cancellation meant for the waiter."""
    stopping = asyncio.Event()
    child = asyncio.create_task(_slow_to_stop(stopping))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cancel_and_wait(child))
    await stopping.wait()  # the child cleans up; its stopper waits for it
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert child.done()


async def test_a_task_that_had_failed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def fail() -> None:
        raise RuntimeError("the watch broke")

    failed = asyncio.create_task(fail(), name="watch agents")
    running = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="rockbot.tasks"):
        await cancel_and_wait(failed, running, None)
    assert running.cancelled()
    assert "watch agents had failed before it was stopped: RuntimeError('the watch broke')" in caplog.text
