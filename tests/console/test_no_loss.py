"""No run event lost or doubled when the writer is killed (kill -9) and the database restarts mid-stream: the real
`rockbot console` process, a real RabbitMQ and a real PostgreSQL, every event counted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from rockbot.bus import CONSOLE, AmqpBus, Principal
from rockbot.bus.topology import CONSOLE_RUNS
from rockbot.console.store import Store
from rockbot.console.store_schema import run_events, runs
from rockbot.contracts.recording import RunEvents
from tests.console.events import typical_run
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

pytestmark = pytest.mark.slow

AGENT = Principal.agent(namespace="team-a", name="triage")
RUNS = 60  # 14 events each: 720 timeline events and 60 runs


def _writer(*, database_url: str, amqp_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ROCKBOT_DATABASE_URL": database_url, "ROCKBOT_AMQP_URL": amqp_url,
           "ROCKBOT_SERVE_HTTP": "false", "ROCKBOT_HEALTH_PORT": "0", "PYTHONSAFEPATH": "1"}  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "rockbot.cli", "console"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip


async def _counts(url: str) -> tuple[int, int]:
    store = await Store.open(url=url, migrate=False)
    try:
        async with store.engine.connect() as connection:
            events = await connection.scalar(select(func.count()).select_from(run_events))
            started = await connection.scalar(select(func.count()).select_from(runs).where(runs.c.source == "chat"))
            return int(events or 0), int(started or 0)
    finally:
        await store.close()


async def test_no_event_is_lost_or_doubled_across_a_killed_writer_and_a_database_restart(
    private_postgres: PostgresServer, vhost: Vhost, tmp_path: Path
) -> None:
    database = private_postgres.create_database()
    console_url = await vhost.url(CONSOLE)
    agent = await AmqpBus.connect(url=await vhost.url(AGENT))
    sent = [typical_run(tools=3) for _ in range(RUNS)]
    expected_events = sum(len(events) - 2 for events in sent)
    log = tmp_path / "writer.log"
    writer = _writer(database_url=database, amqp_url=console_url, log=log)
    try:
        for i, events in enumerate(sent):
            await agent.publish(queue=CONSOLE_RUNS, body=RunEvents(events=events))
            if i == RUNS // 3:  # the writer dies mid-stream, with messages unacked
                writer.send_signal(signal.SIGKILL)
                writer.wait(timeout=10)
                writer = _writer(database_url=database, amqp_url=console_url, log=log)
            if i == 2 * RUNS // 3:  # the database goes away (as a crash: no checkpoint) and comes back
                await asyncio.to_thread(private_postgres.kill)
                await asyncio.sleep(1.0)  # events keep arriving while it is down
                await asyncio.to_thread(private_postgres.start)
        counts = (0, 0)
        for _ in range(600):  # up to 60 s for the writer to catch up after its restart and the database's
            with contextlib.suppress(DBAPIError, OSError):  # the database is still starting
                counts = await _counts(database)
            if counts == (expected_events, RUNS):
                break
            await asyncio.sleep(0.1)
        assert counts == (expected_events, RUNS), f"events, runs in the store; writer log:\n{log.read_text()[-3000:]}"

        async def every_message_acked() -> None:  # copies redelivered after the restarts are taken again, and acked
            ready_and_unacked = (await asyncio.to_thread(vhost.queues))[CONSOLE_RUNS.name]
            assert ready_and_unacked == (0, 0), f"every message acked; writer log:\n{log.read_text()[-3000:]}"

        await eventually(every_message_acked, within=60)
        assert await _counts(database) == (expected_events, RUNS)  # and no copy taken again added a row
    finally:
        writer.send_signal(signal.SIGTERM)
        writer.wait(timeout=15)
        await agent.close()

