"""No call to `execute_python_script` waits on a scripts-manager that is gone: the wait has two steps.

A scripts-manager says when it takes a script (a `RequestAccepted` on the agent's reply queue), and the agent
waits for that only `accept_within_seconds`, then the script's timeout plus the start-up bound the manager gave
(capped by its own). On the memory bus and the real broker, with real managers (the last one a real process,
SIGKILLed after taking the script) and with test consumers playing a manager that takes a script and never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import (
    SCRIPTS_MANAGER,
    AmqpBus,
    Bus,
    Delivery,
    MemoryBroker,
    NotAccepted,
    Principal,
    RequestAccepted,
)
from rockbot.bus.topology import SCRIPT_INVOKE, agent_replies
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import ALICE, login
from tests.fixtures.rabbitmq import Vhost
from tests.ports import free_port
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.test_reaping import CANARY_OFF, manager_process
from tests.waiting import bounded, eventually

BOB = Principal.agent(namespace="default", name="bob")
#: A bound on each call, so that a wait that never ends fails the test instead of hanging it.
WITHIN = 60.0

Connect = Callable[..., Awaitable[Bus]]


@pytest.fixture(params=["memory", "amqp"])
def broker(request: pytest.FixtureRequest) -> MemoryBroker | Vhost:
    """A new memory broker, or a fresh virtual host of the real broker."""
    return MemoryBroker() if request.param == "memory" else request.getfixturevalue("vhost")


@pytest.fixture
async def connect(broker: MemoryBroker | Vhost) -> AsyncIterator[Connect]:
    """Connections of principals to `broker`, closed after the test."""
    opened: list[Bus] = []

    async def open_as(principal: Principal, *, called_by: tuple[Principal, ...] = ()) -> Bus:
        if isinstance(broker, MemoryBroker):
            bus: Bus = await login(broker, principal, called_by=called_by)
        else:
            bus = await AmqpBus.connect(url=await broker.url(principal, called_by=called_by))
        opened.append(bus)
        return bus

    yield open_as
    for bus in reversed(opened):
        await bus.close()


@contextlib.asynccontextmanager
async def taker(bus: Bus, *, answer_within_seconds: float) -> AsyncIterator[list[Delivery]]:
    """A consumer of `script.invoke` that takes every script, says it answers within `answer_within_seconds`,
    and never answers (a manager that died, or hung, after taking it); yields the requests it took."""
    took: list[Delivery] = []

    async def take(delivery: Delivery) -> None:
        took.append(delivery)
        await bus.accept(to=delivery, answer_within_seconds=answer_within_seconds)

    subscription = await bus.consume(queue=SCRIPT_INVOKE, handler=take)
    try:
        yield took
    finally:
        await subscription.close()


async def call(sandbox: ScriptSandbox, **arguments: object) -> ScriptInvokeResponse | ScriptInvokeError:
    return await bounded(sandbox.execute_python_script(**{"script": "print(1)", **arguments}),  # type: ignore[arg-type]
                         within=WITHIN, what="the script call's answer")


async def test_with_no_scripts_manager_a_call_fails_retryably_once_the_acceptance_bound_is_over(
    connect: Connect,
) -> None:
    sandbox = ScriptSandbox(bus=await connect(ALICE), namespace="default", agent="alice", accept_within_seconds=1,
                            start_ceiling_seconds=600)  # fmt: skip
    answer = await call(sandbox, timeout_seconds=300)
    assert isinstance(answer, ScriptInvokeError), answer
    assert (answer.error.code, answer.error.retryable) == (ErrorCode.UNAVAILABLE, True)
    assert answer.error.message.startswith("no scripts-manager took the script within 1 s"), answer.error.message


async def test_a_manager_that_takes_a_script_and_never_answers_fails_the_call_once_its_word_runs_out(
    connect: Connect,
) -> None:
    sandbox = ScriptSandbox(bus=await connect(ALICE), namespace="default", agent="alice", accept_within_seconds=5,
                            start_ceiling_seconds=600)  # fmt: skip
    async with taker(await connect(SCRIPTS_MANAGER), answer_within_seconds=1) as took:
        answer = await call(sandbox, timeout_seconds=300)
    assert len(took) == 1 and took[0].accept_within_seconds == 5
    assert isinstance(answer, ScriptInvokeError), answer
    assert (answer.error.code, answer.error.retryable) == (ErrorCode.TIMEOUT, True)
    assert answer.error.message.startswith("the scripts-manager took the script but gave no answer within the time "
                                           "it gave"), answer.error.message


async def test_not_even_the_managers_word_stretches_the_wait_past_the_agents_own_bound(connect: Connect) -> None:
    sandbox = ScriptSandbox(bus=await connect(ALICE), namespace="default", agent="alice", accept_within_seconds=5,
                            start_ceiling_seconds=1)  # fmt: skip
    async with taker(await connect(SCRIPTS_MANAGER), answer_within_seconds=1e9):
        answer = await call(sandbox, timeout_seconds=1)
    assert isinstance(answer, ScriptInvokeError), answer
    assert (answer.error.code, answer.error.retryable) == (ErrorCode.TIMEOUT, True)
    assert "(at most 2 s)" in answer.error.message, answer.error.message


async def test_a_word_of_acceptance_from_anyone_but_the_scripts_manager_is_not_believed(connect: Connect) -> None:
    """Bob may write to alice's reply queues (he is called by her), so he can try to stretch her wait."""
    alice = await connect(ALICE)
    bob = await connect(BOB, called_by=(ALICE,))
    sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", accept_within_seconds=1,
                            start_ceiling_seconds=600)  # fmt: skip
    replies = agent_replies(namespace="default", name="alice", slot=0)
    await alice.own_replies()

    async def stretch() -> None:
        while True:
            await bob.publish(queue=replies, body=RequestAccepted(answer_within_seconds=1e9), correlation_id="call-1")
            await asyncio.sleep(0.05)

    stretching = asyncio.create_task(stretch())
    try:
        answer = await call(sandbox, timeout_seconds=300, request_id="call-1")
    finally:
        stretching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stretching
    assert isinstance(answer, ScriptInvokeError), answer
    assert (answer.error.code, answer.error.retryable) == (ErrorCode.UNAVAILABLE, True)
    assert answer.error.message.startswith("no scripts-manager took the script within 1 s"), answer.error.message


async def test_a_script_running_longer_than_the_acceptance_bound_is_answered(
    connect: Connect, make_settings: MakeSettings,
) -> None:
    """The normal path: a real manager takes the script and says so, so the agent waits for its answer."""
    manager = ScriptsManager(settings=make_settings(), bus=await connect(SCRIPTS_MANAGER))
    await manager.start()
    try:
        sandbox = ScriptSandbox(bus=await connect(ALICE), namespace="default", agent="alice", accept_within_seconds=1,
                                start_ceiling_seconds=60)  # fmt: skip
        answer = await call(sandbox, script="import time\ntime.sleep(3)\nprint('slept')", timeout_seconds=20)
    finally:
        await manager.stop()
    assert isinstance(answer, ScriptInvokeResponse), answer
    assert answer.stdout == "slept\n"


async def test_a_script_that_waited_for_a_sandbox_past_its_agents_acceptance_bound_is_not_started(
    connect: Connect, make_settings: MakeSettings,
) -> None:
    manager = ScriptsManager(settings=make_settings(scripts_concurrency=1), bus=await connect(SCRIPTS_MANAGER))
    await manager.start()
    alice = await connect(ALICE)
    replies = await alice.own_replies()
    try:
        sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=60)
        first = asyncio.create_task(call(sandbox, script="import time\ntime.sleep(4)\nprint('first')",
                                         timeout_seconds=20))
        await eventually(lambda: _in_flight(manager, 1))
        late = ScriptInvokeRequest(request_id="late", agent="alice", script="print('late')", timeout_seconds=5)
        with pytest.raises(NotAccepted):
            await alice.request(queue=SCRIPT_INVOKE, body=late, reply_queue=replies, correlation_id="late",
                                timeout_seconds=30, responder=SCRIPTS_MANAGER, accept_within_seconds=1)
        answer = await first
        await eventually(lambda: _runs(manager, "Unavailable", 1))
    finally:
        await manager.stop()
    assert isinstance(answer, ScriptInvokeResponse) and answer.stdout == "first\n", answer
    assert manager.metrics.registry.get_sample_value(
        "rockbot_scripts_runs_total", {"backend": "local", "outcome": "succeeded"}) == 1  # the late one never ran


async def _in_flight(manager: ScriptsManager, count: int) -> None:
    assert manager.metrics.registry.get_sample_value("rockbot_scripts_in_flight", {"backend": "local"}) == count


async def _runs(manager: ScriptsManager, outcome: str, count: int) -> None:
    assert manager.metrics.registry.get_sample_value(
        "rockbot_scripts_runs_total", {"backend": "local", "outcome": outcome}) == count


async def test_a_manager_process_killed_after_taking_a_script_fails_the_call_within_the_bound(
    vhost: Vhost, tmp_path: Path,
) -> None:
    """A real `rockbot scripts-manager` (local sandbox) takes a long script, is SIGKILLed, and nobody answers:
    the call fails, retryably, once the script's timeout and the agent's start-up bound are over."""
    port = free_port()
    settings = {"scripts_backend": "local", "amqp_url": await vhost.url(SCRIPTS_MANAGER), "health_port": port,
                "scripts_isolation_targets": CANARY_OFF}
    async with await AmqpBus.connect(url=await vhost.url(ALICE)) as alice:
        sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", accept_within_seconds=15,
                                start_ceiling_seconds=2)  # fmt: skip
        # No kubeconfig is read: the local sandbox needs no cluster (the process's log goes beside it).
        async with manager_process(settings, kubeconfig=tmp_path / "kubeconfig") as doomed:
            await eventually(lambda: _ready(port), within=WITHIN)
            calling = asyncio.create_task(call(sandbox, script="import time\ntime.sleep(60)", timeout_seconds=5))
            await eventually(lambda: _running(port), within=WITHIN)
            doomed.process.kill()
            await doomed.process.wait()
        answer = await calling
    assert isinstance(answer, ScriptInvokeError), answer
    assert (answer.error.code, answer.error.retryable) == (ErrorCode.TIMEOUT, True)
    assert "the script may have run in part" in answer.error.message


async def _ready(port: int) -> None:
    status, text = await _get(port, "readyz")
    assert status == 200, text


async def _running(port: int) -> None:
    _, text = await _get(port, "metrics")
    assert 'rockbot_scripts_in_flight{backend="local"} 1.0' in text, [
        line for line in text.splitlines() if "in_flight" in line]


async def _get(port: int, path: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/{path}") as response:
            return response.status, await response.text()
    except aiohttp.ClientConnectionError as exc:
        raise AssertionError(f"the manager does not listen yet: {exc}") from None
