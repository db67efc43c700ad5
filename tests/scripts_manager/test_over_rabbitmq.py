"""The whole path on a real broker: agent client -> RabbitMQ -> scripts-manager -> sandbox -> back."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import uuid
from pathlib import Path

import aiohttp

from agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, AmqpBus, Delivery, Principal
from rockbot.bus.topology import SCRIPT_INVOKE, Queue, agent_replies
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import ALICE
from tests.fixtures.rabbitmq import RabbitBroker, Vhost, provisioned
from tests.ports import free_port
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.test_service import _make_gate
from tests.waiting import bounded, eventually

#: The timeout of a script that waits on the test's gate: longer than the slowest loaded run of a test (one took 71 s,
#: so a 30 s timeout answered the script before the gate opened); the gate, not the timeout, ends it.
GATED = 240


async def test_script_round_trip_through_rabbitmq(vhost: Vhost, make_settings: MakeSettings) -> None:
    manager = ScriptsManager(settings=make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER)))
    await manager.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(ALICE)) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=30)
            results = await asyncio.gather(*(
                sandbox.execute_python_script(script=f"print({n} * {n})", request_id=f"sq-{n}") for n in range(6)
            ))
    finally:
        await manager.stop()
    assert [(r.request_id, r.stdout) for r in results] == [(f"sq-{n}", f"{n * n}\n") for n in range(6)]
    assert {(r.backend, r.pod) for r in results} == {("local/bwrap", "")}  # where they ran: no pod, bubblewrap


async def test_a_broker_restart_mid_run_still_gets_the_script_answered(
    private_rabbitmq: RabbitBroker, make_settings: MakeSettings
) -> None:
    async with provisioned(private_rabbitmq, "/") as vhost:
        manager_url, alice_url = await vhost.url(SCRIPTS_MANAGER), await vhost.url(ALICE)
    manager = ScriptsManager(settings=make_settings(amqp_url=manager_url))
    await manager.start()
    try:
        async with await AmqpBus.connect(url=alice_url, publish_timeout=60) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=60)
            call = asyncio.create_task(sandbox.execute_python_script(
                script="import time\nprint('started', flush=True)\ntime.sleep(3)\nprint('done')",
                request_id="through-restart",
            ))  # fmt: skip

            async def running() -> None:
                assert manager.metrics.registry.get_sample_value("rockbot_scripts_in_flight", {"backend": "local"}) == 1

            await eventually(running, within=30)
            await asyncio.to_thread(private_rabbitmq.restart)
            result = await bounded(call, within=120, what="the script's answer through the broker's restart")
    finally:
        await manager.stop()
    assert isinstance(result, ScriptInvokeResponse), result
    assert (result.request_id, result.stdout, result.exit_code) == ("through-restart", "started\ndone\n", 0)


async def test_a_manager_stopped_mid_run_leaves_the_request_to_another_that_answers_it_once(
    vhost: Vhost, make_settings: MakeSettings
) -> None:
    # The script waits on a host fifo (unshare isolation lets it see one), so the first manager is
    # certainly mid-run, un-acked, when it stops; the second one's run is let through by the test.
    settings = make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER), scripts_local_isolation="unshare")
    first, second = ScriptsManager(settings=settings), ScriptsManager(settings=settings)
    gate = await asyncio.to_thread(_make_gate)
    request = ScriptInvokeRequest(
        request_id=f"mid-run-{uuid.uuid4().hex}", agent="alice", timeout_seconds=GATED,
        script=f"print(open({str(gate)!r}).read())",
    )  # fmt: skip

    await first.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(ALICE)) as agent:
            replies, answers = await _send_collecting_answers(agent, request)
            await eventually(lambda: _running(first))
            await first.stop()  # dies mid-run: its run is cancelled, the request never acked
            assert answers == []
            await second.start()
            await eventually(lambda: _running(second))  # the broker redelivered the request to it
            token = uuid.uuid4().hex
            await asyncio.to_thread(gate.write_text, token)
            await eventually(lambda: _answered_and_drained(vhost, replies, answers), within=30)
    finally:
        await first.stop()
        await second.stop()
        await asyncio.to_thread(shutil.rmtree, gate.parent, True)
    assert len(answers) == 1, answers
    answer = answers[0].decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(answer, ScriptInvokeResponse), answer
    assert (answer.request_id, answer.stdout, answer.exit_code) == (request.request_id, f"{token}\n", 0)
    assert _sample(first, "rockbot_scripts_runs_total", outcome="succeeded") is None  # its run never finished
    assert _sample(second, "rockbot_scripts_runs_total", outcome="succeeded") == 1


async def test_a_manager_whose_connection_drops_mid_run_runs_the_script_once_and_answers_once(
    rabbitmq: RabbitBroker, vhost: Vhost, make_settings: MakeSettings
) -> None:
    # The broker closes the manager's connection while the script waits on the test's fifo. The
    # delivery is lost un-acked and redelivered after the robust reconnect: it must join the run in
    # flight, not start the script again.
    name = f"manager-{uuid.uuid4().hex[:8]}"
    manager_url = await vhost.url(SCRIPTS_MANAGER, connection_name=name)
    settings = make_settings(amqp_url=manager_url, scripts_local_isolation="unshare")
    manager = ScriptsManager(settings=settings)
    gate = await asyncio.to_thread(_make_gate)
    starts = gate.parent / "starts"  # each run of the script leaves a line here before it waits
    await asyncio.to_thread(starts.touch, 0o666)
    await asyncio.to_thread(starts.chmod, 0o666)
    request = ScriptInvokeRequest(
        request_id=f"dropped-{uuid.uuid4().hex}", agent="alice", timeout_seconds=GATED,
        script=f"open({str(starts)!r}, 'a').write('started\\n')\nprint(open({str(gate)!r}).read())",
    )  # fmt: skip

    await manager.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(ALICE)) as agent:
            replies, answers = await _send_collecting_answers(agent, request)
            await eventually(lambda: _running(manager))
            await asyncio.to_thread(rabbitmq.close_connection, name=name, reason="manager connection lost")

            async def redelivered_and_joined() -> None:
                queues = await asyncio.to_thread(vhost.queues)
                assert queues[SCRIPT_INVOKE.name] == (0, 1), queues  # back with the reconnected manager

            await eventually(redelivered_and_joined, within=120)
            token = uuid.uuid4().hex
            await asyncio.to_thread(gate.write_text, token)
            await eventually(lambda: _answered_and_drained(vhost, replies, answers), within=30)
            runs = await asyncio.to_thread(starts.read_text)
    finally:
        await manager.stop()
        await asyncio.to_thread(shutil.rmtree, gate.parent, True)
    assert len(answers) == 1, answers
    answer = answers[0].decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(answer, ScriptInvokeResponse), answer
    assert (answer.stdout, answer.exit_code) == (f"{token}\n", 0)
    assert runs == "started\n"  # the redelivered copy joined the run in flight: the script ran once


async def _send_collecting_answers(agent: AmqpBus, request: ScriptInvokeRequest) -> tuple[Queue, list[Delivery]]:
    """Publish `request` as an agent would, without waiting: every answer lands in the returned list."""
    replies = agent_replies(namespace="default", name=request.agent, slot=0)
    answers: list[Delivery] = []

    async def collect(delivery: Delivery) -> None:
        answers.append(delivery)

    await agent.consume(queue=replies, handler=collect)
    await agent.publish(queue=SCRIPT_INVOKE, body=request, correlation_id=request.request_id, reply_to=replies.name)
    return replies, answers


async def _running(manager: ScriptsManager) -> None:
    assert _sample(manager, "rockbot_scripts_in_flight") == 1


async def _answered_and_drained(vhost: Vhost, replies: Queue, answers: list[Delivery]) -> None:
    assert answers, "no answer yet"
    queues = await asyncio.to_thread(vhost.queues)
    assert queues[SCRIPT_INVOKE.name] == queues[replies.name] == (0, 0), queues


def _sample(manager: ScriptsManager, name: str, **labels: str) -> float | None:
    return manager.metrics.registry.get_sample_value(name, {"backend": "local", **labels})


#: The installed `rockbot` command, next to this interpreter.
CLI = [str(Path(sys.executable).parent / "rockbot"), "scripts-manager"]


async def test_cli_serves_until_sigterm_and_refuses_bad_settings(vhost: Vhost, tmp_path: Path) -> None:
    port = free_port()
    env = {
        "PATH": os.environ["PATH"], "ROCKBOT_AMQP_URL": await vhost.url(SCRIPTS_MANAGER),
        "ROCKBOT_SCRIPTS_BACKEND": "local",
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
        cli_agent = Principal.agent(namespace="default", name="cli")
        async with await AmqpBus.connect(url=await vhost.url(cli_agent)) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="cli", start_ceiling_seconds=30)
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
