"""The whole path on a real broker: agent client -> RabbitMQ -> scripts-manager -> sandbox -> back."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from agent.sandbox import ScriptSandbox
from rockbot.bus import AmqpBus
from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from tests.fixtures.rabbitmq import RabbitBroker
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually


async def test_script_round_trip_through_rabbitmq(amqp_url: str, make_settings: MakeSettings) -> None:
    manager = ScriptsManager(settings=make_settings(amqp_url=amqp_url))
    await manager.start()
    try:
        async with await AmqpBus.connect(url=amqp_url) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", reply_grace_seconds=30)
            results = await asyncio.gather(*(
                sandbox.execute_python_script(script=f"print({n} * {n})", request_id=f"sq-{n}") for n in range(6)
            ))
    finally:
        await manager.stop()
    assert [(r.request_id, r.stdout) for r in results] == [(f"sq-{n}", f"{n * n}\n") for n in range(6)]


async def test_a_broker_restart_mid_run_still_gets_the_script_answered(
    private_rabbitmq: RabbitBroker, make_settings: MakeSettings
) -> None:
    manager = ScriptsManager(settings=make_settings(amqp_url=private_rabbitmq.url))
    await manager.start()
    try:
        async with await AmqpBus.connect(url=private_rabbitmq.url, publish_timeout=60) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", reply_grace_seconds=60)
            call = asyncio.create_task(sandbox.execute_python_script(
                script="import time\nprint('started', flush=True)\ntime.sleep(3)\nprint('done')",
                request_id="through-restart",
            ))  # fmt: skip

            async def running() -> None:
                assert manager.metrics.registry.get_sample_value("rockbot_scripts_in_flight", {"backend": "local"}) == 1

            await eventually(running, within=30)
            await asyncio.to_thread(private_rabbitmq.restart)
            result = await call
    finally:
        await manager.stop()
    assert isinstance(result, ScriptInvokeResponse), result
    assert (result.request_id, result.stdout, result.exit_code) == ("through-restart", "started\ndone\n", 0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: The installed `rockbot` command, next to this interpreter.
CLI = [str(Path(sys.executable).parent / "rockbot"), "scripts-manager"]


async def test_cli_serves_until_sigterm_and_refuses_bad_settings(amqp_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {
        "PATH": os.environ["PATH"], "ROCKBOT_AMQP_URL": amqp_url, "ROCKBOT_SCRIPTS_BACKEND": "local",
        "ROCKBOT_HEALTH_HOST": "127.0.0.1", "ROCKBOT_HEALTH_PORT": str(port), "ROCKBOT_DRAIN_SECONDS": "1",
    }  # fmt: skip
    bad = await asyncio.create_subprocess_exec(
        *CLI, cwd=tmp_path, env={**env, "ROCKBOT_SCRIPTS_CONCURRENCY": "zero"},
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await bad.communicate()
    assert bad.returncode == 2
    assert "ROCKBOT_SCRIPTS_CONCURRENCY" in err.decode()

    process = await asyncio.create_subprocess_exec(
        *CLI, "--log-format", "text", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            async def ready() -> None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as response:
                        assert response.status == 200
                except aiohttp.ClientConnectionError as exc:
                    raise AssertionError("not listening yet") from exc

            await eventually(ready, within=30)
        async with await AmqpBus.connect(url=amqp_url) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="cli", reply_grace_seconds=30)
            result = await sandbox.execute_python_script(
                script="print('from the cli')"
            )
        assert isinstance(result, ScriptInvokeResponse) and result.stdout == "from the cli\n", result
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
