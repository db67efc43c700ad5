"""An agent's `/readyz` over a real broker: ready only once its inbox consumes (a Service, and the operator's
Ready condition, count a ready pod as one that takes requests), and a broker lost while it subscribes is waited
for, not a crash."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from rockbot.agent import cli, inbox
from rockbot.bus import LOCAL, Principal
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedLLM
from tests.fixtures.rabbitmq import RabbitBroker, Vhost, provisioned
from tests.pod_process import http_get, late_rabbitmq
from tests.ports import free_port
from tests.waiting import eventually

__all__ = ["late_rabbitmq"]  # fixture
ServeInbox = Callable[..., Awaitable[Any]]


async def readyz(port: int) -> tuple[int, str] | None:
    """What `/readyz` answers, or None when nothing does (within 2 s: a probe never waits unbounded)."""
    return await http_get(f"http://127.0.0.1:{port}/readyz")


@contextlib.asynccontextmanager
async def serving(config, *, url: str, port: int) -> AsyncIterator[asyncio.Task[int]]:
    """The agent process's `_serve`, in this process; stopped as SIGTERM stops it."""
    stop = asyncio.Event()
    args = argparse.Namespace(bus=url, host="127.0.0.1", port=port, drain_seconds=1.0)
    task = asyncio.create_task(cli._serve(args, config=config, token=None, stop=stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.shield(task), timeout=30)


async def agent_on(vhost: Vhost, scripted_llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch):
    """A provisioned agent's config and its login URL on `vhost`."""
    monkeypatch.setenv(API_KEY_ENV, "sk-test")
    config = agent_config(llm_url=scripted_llm.url)
    await vhost.provision([config], scheduler=LOCAL)
    return config, vhost.url_of(Principal.agent(namespace=config.namespace, name=config.name))


async def test_the_agent_is_ready_only_once_its_inbox_consumes(
    vhost: Vhost, scripted_llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, url = await agent_on(vhost, scripted_llm, monkeypatch)
    port = free_port()
    said_before_subscribing: list[tuple[int, str]] = []
    subscribe: ServeInbox = inbox.serve_inbox

    async def observed(**kwargs: Any) -> Any:
        said_before_subscribing.append(await readyz(port))
        return await subscribe(**kwargs)

    monkeypatch.setattr(inbox, "serve_inbox", observed)
    async with serving(config, url=url, port=port) as task:
        await eventually(lambda: _ready(port), within=30)
        assert not task.done()
    (answer,) = said_before_subscribing
    assert answer is not None and answer[0] == 503 and "inbox" in answer[1], answer
    assert task.result() == 0


async def test_a_broker_lost_while_the_agent_subscribes_is_waited_for_and_the_agent_becomes_ready_after_it(
    late_rabbitmq: RabbitBroker, scripted_llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    await asyncio.to_thread(late_rabbitmq.start)
    async with provisioned(late_rabbitmq, "/") as vhost:
        config, url = await agent_on(vhost, scripted_llm, monkeypatch)
    port = free_port()
    subscribe: ServeInbox = inbox.serve_inbox
    attempts = 0

    async def broker_gone_at_first(**kwargs: Any) -> Any:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            await asyncio.to_thread(late_rabbitmq.stop_server)
        return await subscribe(**kwargs)

    monkeypatch.setattr(inbox, "serve_inbox", broker_gone_at_first)
    async with serving(config, url=url, port=port) as task:
        why = await eventually(lambda: _not_ready(port, task, saying="attempt"), within=30)
        assert "inbox" in why
        await asyncio.to_thread(late_rabbitmq.start)
        await eventually(lambda: _ready(port), within=60)
        assert attempts >= 2
    assert task.result() == 0


async def test_no_other_process_can_bind_the_agents_port_while_it_waits_for_the_broker_or_serves(
    late_rabbitmq: RabbitBroker, scripted_llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up health server hands the port to the agent's own server without sharing it: a second server
    asking to share it (SO_REUSEPORT) is refused, and would otherwise get some of the agent's connections."""
    await asyncio.to_thread(late_rabbitmq.start)
    async with provisioned(late_rabbitmq, "/") as vhost:
        config, url = await agent_on(vhost, scripted_llm, monkeypatch)
    await asyncio.to_thread(late_rabbitmq.stop_server)
    port = free_port()
    async with serving(config, url=url, port=port) as task:
        await eventually(lambda: _not_ready(port, task, saying="broker"), within=30)
        with pytest.raises(OSError, match="in use"):
            _listen_beside(port)
        await asyncio.to_thread(late_rabbitmq.start)
        await eventually(lambda: _ready(port), within=60)
        with pytest.raises(OSError, match="in use"):
            _listen_beside(port)
    assert task.result() == 0


def _listen_beside(port: int) -> None:
    """Listen on `port` as a second server sharing it would (SO_REUSEPORT)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


async def _ready(port: int) -> None:
    answer = await readyz(port)
    assert answer is not None and answer[0] == 200, answer


async def _not_ready(port: int, task: asyncio.Task[int], *, saying: str) -> str:
    """What `/readyz` says while the agent, still running, is not ready and says `saying`."""
    assert not task.done(), f"the agent ended: {task.exception() or task.result()}"
    answer = await readyz(port)
    assert answer is not None and answer[0] == 503 and saying in answer[1], answer
    return answer[1]
