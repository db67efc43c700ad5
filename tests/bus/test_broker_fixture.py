"""The broker fixture never leaves a test waiting on a dead broker: a death is noticed, reaped and reported."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.rabbitmq import RabbitBroker, _Interrupter, _live_members

pytestmark = pytest.mark.slow  # starts a broker of its own


@pytest.fixture
def late_rabbitmq(tmp_path: Path) -> Iterator[RabbitBroker]:
    """A broker of this test's own, which no guard watches (its death is what the test makes)."""
    broker = RabbitBroker(root=tmp_path)
    try:
        yield broker
    finally:
        broker.stop()


async def test_a_broker_whose_server_dies_is_reaped_and_reported(late_rabbitmq: RabbitBroker) -> None:
    await asyncio.to_thread(late_rabbitmq.start)
    heard: list[str] = []
    late_rabbitmq.on_death.append(heard.append)
    server = late_rabbitmq._server
    assert server is not None
    os.killpg(server.pid, signal.SIGKILL)  # as a crash would: nobody asked it to stop

    async def noticed() -> None:
        for _ in range(100):
            if heard:
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the broker's death went unnoticed for 10 s")

    await noticed()
    assert server.returncode == -signal.SIGKILL  # reaped: no <defunct> server left behind
    assert late_rabbitmq.died == heard[0]
    assert f"127.0.0.1:{late_rabbitmq.port}) died" in heard[0]
    with pytest.raises(pytest.fail.Exception, match="died"):
        late_rabbitmq.ensure_alive()


async def test_a_stopped_broker_leaves_no_process_of_its_group_running(late_rabbitmq: RabbitBroker) -> None:
    await asyncio.to_thread(late_rabbitmq.start)
    group = late_rabbitmq._server.pid
    await asyncio.to_thread(late_rabbitmq.stop_server)
    assert _live_members(group) == []
    assert late_rabbitmq.died is None  # stopped on purpose: not a death


def test_a_death_heard_in_another_thread_fails_the_running_test_at_once(_interrupter: _Interrupter) -> None:
    _interrupter.armed = True
    try:
        threading.Timer(0.2, _interrupter, args=("the broker died (as the watcher reports it)",)).start()
        with pytest.raises(pytest.fail.Exception, match="the broker died"):
            asyncio.run(asyncio.sleep(30))  # an event loop waiting on something that would never come
    finally:
        _interrupter.armed = False
