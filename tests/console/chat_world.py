"""A chat as deployed, for the console's chat tests: a real RabbitMQ (the test's virtual host, provisioned as the
operator would), the agent as its own `rockbot agent` process on its own login, the scripted OpenAI-compatible
SSE server as its model, and the console's side (its login, the run store with its writer and history answers,
the chat relay) in the test's process."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from prometheus_client import CollectorRegistry

from rockbot.bus import CONSOLE, AmqpBus, Bus, Principal
from rockbot.console.chat import ChatRelay
from rockbot.console.recording import HistoryAnswerer, RecorderMetrics, RunWriter
from rockbot.console.store import Store
from rockbot.contracts.agent_config import AgentConfig
from rockbot.health import Readiness
from tests.agent.configs import API_KEY_ENV
from tests.agent.test_cli import bound_port, ready, rockbot_agent
from tests.fixtures.rabbitmq import Vhost


@dataclass(kw_only=True)
class ChatWorld:
    relay: ChatRelay
    store: Store
    console_bus: Bus
    agent_process: asyncio.subprocess.Process
    metrics: RecorderMetrics


@contextlib.asynccontextmanager
async def agent_process(config: AgentConfig, *, bus_url: str,
                        folder: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`rockbot agent` on its own broker login, once it is ready (its inbox consumed)."""
    path = folder / f"{config.name}.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command, env = rockbot_agent("--config", str(path), "--bus", bus_url, "--host", "127.0.0.1", "--port", "0",
                                 "--log-format", "text", env={API_KEY_ENV: "k"})
    process = await asyncio.create_subprocess_exec(*command, env=env, stderr=asyncio.subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{await asyncio.wait_for(bound_port(process), 60)}"
        async with aiohttp.ClientSession() as http:
            await asyncio.wait_for(ready(http, base, process), 60)
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)


@contextlib.asynccontextmanager
async def chat_world(config: AgentConfig, *, vhost: Vhost, folder: Path) -> AsyncIterator[ChatWorld]:
    await vhost.provision([config])
    store = await Store.open(url=f"sqlite:///{folder / 'runs.db'}")
    console_bus = await AmqpBus.connect(url=vhost.url_of(CONSOLE))
    metrics = RecorderMetrics(CollectorRegistry())
    writer = RunWriter(store=store, bus=console_bus, readiness=Readiness(), metrics=metrics)
    history = HistoryAnswerer(store=store, bus=console_bus, metrics=metrics)
    relay = ChatRelay(timeout_seconds=60, store=store)
    try:
        await writer.start()
        await history.start()
        await relay.start(bus=console_bus)
        me = Principal.agent(namespace=config.namespace, name=config.name)
        async with agent_process(config, bus_url=vhost.url_of(me), folder=folder) as process:
            yield ChatWorld(relay=relay, store=store, console_bus=console_bus, agent_process=process, metrics=metrics)
    finally:
        await relay.stop()
        await history.stop()
        await writer.stop()
        await console_bus.close()
        await store.close()

