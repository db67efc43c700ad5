"""The scripts-manager as an agent meets it: over the bus, through the agent's client, with real sandboxes."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, Delivery, MemoryBroker, MemoryBus, Principal
from rockbot.bus.topology import SCRIPT_INVOKE, agent_replies
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, ScriptInvokeError, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import login
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually

WAIT = 30.0


AsAgent = Callable[[str], Awaitable[MemoryBus]]


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
async def as_agent(broker: MemoryBroker) -> AsyncIterator[AsAgent]:
    """The one connection of agent default/<name> (two would compete for its reply queue)."""
    opened: dict[str, MemoryBus] = {}

    async def connect(name: str) -> MemoryBus:
        if name not in opened:
            opened[name] = await login(broker, Principal.agent(namespace="default", name=name))
        return opened[name]

    yield connect
    for bus in opened.values():
        await bus.close()


@pytest.fixture
async def manager_bus(broker: MemoryBroker) -> AsyncIterator[MemoryBus]:
    async with await login(broker, SCRIPTS_MANAGER) as bus:
        yield bus


@pytest.fixture
async def bus(as_agent: AsAgent) -> MemoryBus:
    """Agent default/alice's connection."""
    return await as_agent("alice")


@pytest.fixture
async def manager(manager_bus: MemoryBus, make_settings: MakeSettings) -> AsyncIterator[ScriptsManager]:
    manager = ScriptsManager(settings=make_settings(scripts_max_timeout_seconds=60), bus=manager_bus)
    await manager.start()
    yield manager
    await manager.stop()


@pytest.fixture
def sandbox(bus: MemoryBus) -> ScriptSandbox:
    return ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=WAIT)


async def test_script_runs_and_the_agent_gets_both_streams(manager: ScriptsManager, sandbox: ScriptSandbox) -> None:
    result = await sandbox.execute_python_script(
        script="import sys, json\ndata = json.load(sys.stdin)\nprint(sum(data['xs']))\nprint('note', file=sys.stderr)",
        input_data={"xs": [1, 2, 3]},
        request_id="call-1",
    )
    assert isinstance(result, ScriptInvokeResponse), result
    assert (result.request_id, result.stdout, result.stderr, result.exit_code) == ("call-1", "6\n", "note\n", 0)


@pytest.mark.parametrize(
    ("arguments", "code", "fragment"),
    [
        ({"timeout_seconds": 61}, ErrorCode.INVALID_ARGUMENTS, "timeout_seconds=61 is over the limit of 60"),
        ({"pip_packages": ["numpy>=2"]}, ErrorCode.INVALID_ARGUMENTS, "pip_packages[0]='numpy>=2' is not a package"),
        ({"pip_packages": ["numpy"]}, ErrorCode.REJECTED, "ROCKBOT_SCRIPTS_ALLOWED_PACKAGES"),
        ({"script": "x" * 300_000}, ErrorCode.INVALID_ARGUMENTS, "script is 300000 bytes, over the limit"),
    ],
)
async def test_requests_outside_the_limits_get_a_clear_error(
    manager: ScriptsManager, sandbox: ScriptSandbox, arguments: dict, code: ErrorCode, fragment: str
) -> None:
    result = await sandbox.execute_python_script(**{"script": "print(1)", **arguments})
    assert isinstance(result, ScriptInvokeError), result
    assert result.error.code == code
    assert fragment in result.error.message
    assert result.error.retryable is False


async def test_bad_arguments_are_refused_by_the_client_before_sending(sandbox: ScriptSandbox) -> None:
    result = await sandbox.execute_python_script(script="", timeout_seconds=-1)
    assert isinstance(result, ScriptInvokeError)
    assert result.error.code == ErrorCode.INVALID_ARGUMENTS
    assert "script:" in result.error.message and "timeout_seconds:" in result.error.message


async def test_a_body_that_is_not_a_request_is_answered_with_invalid_arguments(
    manager: ScriptsManager, as_agent: AsAgent
) -> None:
    reply = await (await as_agent("mallory")).request(
        queue=SCRIPT_INVOKE,
        body=ErrorInfo(code=ErrorCode.TIMEOUT, message="not a request"),
        reply_queue=agent_replies(namespace="default", name="mallory", slot=0),
        correlation_id="junk-1",
        timeout_seconds=WAIT,
        responder=SCRIPTS_MANAGER,
    )
    answer = reply.decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(answer, ScriptInvokeError)
    assert (answer.request_id, answer.error.code) == ("junk-1", ErrorCode.INVALID_ARGUMENTS)
    assert "request_id: Field required" in answer.error.message


async def test_no_manager_means_a_retryable_error_as_data(bus: MemoryBus) -> None:
    sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", accept_within_seconds=0.2)
    result = await sandbox.execute_python_script(script="print(1)", timeout_seconds=0.1)
    assert isinstance(result, ScriptInvokeError)
    assert result.error.code == ErrorCode.UNAVAILABLE and result.error.retryable is True


async def test_a_duplicate_request_is_run_once_and_both_copies_are_answered(
    manager_bus: MemoryBus, as_agent: AsAgent, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    # unshare (explicitly chosen) lets the script see a host fifo: the test holds it there until the
    # second copy has been seen joining the run, so only joining (not replaying) can answer it.
    caplog.set_level(logging.INFO, logger="rockbot.bus.once")
    manager = ScriptsManager(settings=make_settings(scripts_local_isolation="unshare"), bus=manager_bus)
    await manager.start()
    gate = await asyncio.to_thread(_make_gate)
    bus = await as_agent("bob")
    try:
        replies = agent_replies(namespace="default", name="bob", slot=0)
        answers: asyncio.Queue[Delivery] = asyncio.Queue()
        await bus.consume(queue=replies, handler=answers.put)
        request = ScriptInvokeRequest(
            request_id=f"dup-{uuid.uuid4().hex}", agent="bob", timeout_seconds=20,
            script=f"print(open({str(gate)!r}).read())",
        )  # fmt: skip
        await bus.publish(queue=SCRIPT_INVOKE, body=request, correlation_id=request.request_id, reply_to=replies.name)

        async def running() -> None:
            assert _sample(manager, "rockbot_scripts_in_flight", backend="local") == 1

        await eventually(running)
        await bus.publish(queue=SCRIPT_INVOKE, body=request, correlation_id=request.request_id, reply_to=replies.name)

        async def joined() -> None:
            assert any("is being handled; waiting for that run" in r.getMessage() for r in caplog.records)

        await eventually(joined)
        token = uuid.uuid4().hex
        await asyncio.to_thread(gate.write_text, token)  # opens the gate: the script reads and ends
        first, second = [await asyncio.wait_for(answers.get(), WAIT) for _ in range(2)]
        assert first.decode(SCRIPT_INVOKE_REPLY) == second.decode(SCRIPT_INVOKE_REPLY)
        assert first.decode(SCRIPT_INVOKE_REPLY).stdout == f"{token}\n"  # type: ignore[union-attr]
        # A third copy after the answer (a redelivery) gets the remembered answer, not a new run.
        await bus.publish(queue=SCRIPT_INVOKE, body=request, correlation_id=request.request_id, reply_to=replies.name)
        third = await asyncio.wait_for(answers.get(), WAIT)
        assert third.decode(SCRIPT_INVOKE_REPLY) == first.decode(SCRIPT_INVOKE_REPLY)
        assert _sample(manager, "rockbot_scripts_run_duration_seconds_count", backend="local") == 1
    finally:
        await manager.stop()
        await asyncio.to_thread(shutil.rmtree, gate.parent, True)


def _make_gate() -> Path:
    """A fifo any sandbox user can read; reading it blocks the script until the test writes."""
    directory = Path(tempfile.mkdtemp(prefix="rockbot-gate-"))
    directory.chmod(0o755)
    gate = directory / "gate"
    os.mkfifo(gate)
    gate.chmod(0o666)
    return gate


async def _ask(as_agent: AsAgent, request: ScriptInvokeRequest) -> ScriptInvokeResponse | ScriptInvokeError:
    """Sends `request` as the agent it names."""
    reply = await (await as_agent(request.agent)).request(
        queue=SCRIPT_INVOKE, body=request, reply_queue=agent_replies(namespace="default", name=request.agent,
                                                                   slot=0),
        correlation_id=request.request_id, timeout_seconds=WAIT, responder=SCRIPTS_MANAGER,
    )  # fmt: skip
    return reply.decode(SCRIPT_INVOKE_REPLY)


async def test_the_same_request_id_from_another_agent_is_another_request(
    manager: ScriptsManager, as_agent: AsAgent
) -> None:
    request_id = f"call-{uuid.uuid4().hex}"
    alice = await _ask(as_agent, ScriptInvokeRequest(request_id=request_id, agent="alice", script="print('alice')"))
    bob = await _ask(as_agent, ScriptInvokeRequest(request_id=request_id, agent="bob", script="print('bob')"))
    assert isinstance(alice, ScriptInvokeResponse) and alice.stdout == "alice\n", alice
    assert isinstance(bob, ScriptInvokeResponse) and bob.stdout == "bob\n", bob


async def test_a_reused_request_id_with_another_script_is_rejected_not_answered_from_memory(
    manager: ScriptsManager, as_agent: AsAgent
) -> None:
    request_id = f"call-{uuid.uuid4().hex}"
    first = await _ask(as_agent, ScriptInvokeRequest(request_id=request_id, agent="alice", script="print('first')"))
    assert isinstance(first, ScriptInvokeResponse) and first.stdout == "first\n", first
    reused = await _ask(as_agent, ScriptInvokeRequest(request_id=request_id, agent="alice", script="print('second')"))
    assert isinstance(reused, ScriptInvokeError), reused
    assert (reused.error.code, reused.error.retryable) == (ErrorCode.REJECTED, False)
    assert f"request_id {request_id!r} of agent 'alice' was already used" in reused.error.message


async def test_health_readiness_and_metrics_over_http(
    manager: ScriptsManager, sandbox: ScriptSandbox
) -> None:
    await sandbox.execute_python_script(script="raise SystemExit(2)")
    base = f"http://127.0.0.1:{manager.health.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/healthz") as response:
            assert response.status == 200
        async with http.get(f"{base}/readyz") as response:
            assert response.status == 200
        async with http.get(f"{base}/metrics") as response:
            text = await response.text()
    assert 'rockbot_scripts_runs_total{backend="local",outcome="exited_nonzero"} 1.0' in text
    assert 'rockbot_scripts_in_flight{backend="local"} 0.0' in text


async def test_not_ready_once_stopped(manager_bus: MemoryBus, make_settings: MakeSettings) -> None:
    manager = ScriptsManager(settings=make_settings(), bus=manager_bus)
    await manager.start()
    await manager._service.stop()  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{manager.health.port}/readyz") as response:
        assert response.status == 503
    await manager.stop()


def _sample(manager: ScriptsManager, name: str, **labels: str) -> float | None:
    return manager.metrics.registry.get_sample_value(name, labels)


async def test_a_package_outside_the_allowed_list_is_rejected_naming_it_and_the_setting(
    manager_bus: MemoryBus, bus: MemoryBus, make_settings: MakeSettings
) -> None:
    manager = ScriptsManager(settings=make_settings(scripts_allowed_packages=["rockbot-demo-pkg"]), bus=manager_bus)
    await manager.start()
    try:
        sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=WAIT)
        result = await sandbox.execute_python_script(script="import numpy", pip_packages=["Rockbot_Demo_Pkg", "NumPy"])
    finally:
        await manager.stop()
    assert isinstance(result, ScriptInvokeError), result
    assert (result.error.code, result.error.retryable) == (ErrorCode.REJECTED, False)
    assert result.error.message == (
        "pip_packages numpy not allowed here; allowed: rockbot-demo-pkg (ROCKBOT_SCRIPTS_ALLOWED_PACKAGES)"
    )
    assert _sample(manager, "rockbot_scripts_runs_total", backend="local", outcome="Rejected") == 1
