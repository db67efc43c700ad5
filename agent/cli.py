"""`rockbot agent --config FILE`: run one agent: its inbox on the bus and its HTTP endpoint.

The config is the YAML/JSON document the operator renders into the agent's ConfigMap. The bus is
RabbitMQ at `--bus URL` (default: `$ROCKBOT_AMQP_URL`), or `--bus memory` for a self-contained
process (no inbox from outside, no scripts-manager). Until the broker answers, the agent is live
but not ready (`/readyz` says why) and keeps trying. SIGTERM drains: the inbox stops taking
messages, in-flight turns get `--drain-seconds` to finish (unfinished ones are redelivered to the
next pod), then the HTTP server and connections close; a broker that is gone delays none of it
by more than seconds. On RabbitMQ the process reports the tokens it uses to the operator, which keeps
the Agent's day in its status and answers with the total the daily budget is checked against.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import yaml
from aiohttp import web
from pydantic import ValidationError

from rockbot.contracts.agent_config import AMQP_URL_ENV, AgentConfig
from rockbot.logs import setup_logging
from rockbot.tasks import cancel_and_wait

T = TypeVar("T")

log = logging.getLogger("rockbot.agent")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, type=Path, help="the rendered agent config (YAML or JSON)")
    parser.add_argument(
        "--bus", default=None, help=f"AMQP URL of the bus, or 'memory' (default: ${AMQP_URL_ENV})"
    )
    parser.add_argument("--host", default="0.0.0.0", help="HTTP listen address (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (default: 8080)")
    parser.add_argument("--drain-seconds", type=float, default=20.0, help="time to finish in-flight turns on stop")
    parser.add_argument("--log-format", choices=["json", "text"], default="json", help="log lines (default: json)")


def load_config(path: Path) -> AgentConfig:
    """Read and validate the config; errors name the file and the field."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SystemExit(f"rockbot agent: cannot read --config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SystemExit(f"rockbot agent: --config {path} is not valid YAML/JSON: {exc}") from None
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()[:10])
        raise SystemExit(f"rockbot agent: --config {path} is not a valid agent config: {problems}") from None


def http_token(config: AgentConfig) -> str | None:
    if config.http_token is None:
        return None
    token = os.environ.get(config.http_token.env)
    if not token:
        raise SystemExit(
            f"rockbot agent: http_token names env var {config.http_token.env}, which is empty; "
            "the operator wires it from the agent's token Secret"
        )
    return token


def run(args: argparse.Namespace) -> int:
    setup_logging(log_format=args.log_format)
    try:
        config = load_config(args.config)
        token = http_token(config)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    return asyncio.run(_serve_until_signalled(args, config=config, token=token))


async def _serve_until_signalled(args: argparse.Namespace, *, config: AgentConfig, token: str | None) -> int:
    from rockbot.health import stop_on_signals

    return await _serve(args, config=config, token=token, stop=stop_on_signals())


def _listen(host: str, port: int) -> socket.socket:
    """The agent's port, bound once for the process: the start-up health server serves a duplicate of it and the
    agent's own server the socket itself, so the port never closes in between and is never shared with another
    process (no SO_REUSEPORT)."""
    family, _, _, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]  # fmt: skip
    return socket.create_server(address[:2], family=family)


async def _wait_for_broker(url: str, *, listener: socket.socket, stop: asyncio.Event):
    """Connect to the broker, retrying until it answers or `stop` is set (then None).

    Meanwhile `/healthz` answers on the agent's port and `/readyz` says what it waits for, so the
    kubelet sees a live pod that is not ready rather than one to restart. Returns the bus and the
    health server, which the caller stops once the agent's own server serves `listener` too.
    """
    from rockbot.bus import AmqpBus
    from rockbot.health import HealthServer, Readiness

    readiness = Readiness()
    readiness.waiting("agent", "starting")  # until the agent's own server takes this port over
    health = HealthServer(readiness=readiness)
    await health.start(sock=listener.dup())
    bus = await _unless_stopped(AmqpBus.connect_when_ready(url=url, readiness=readiness), stop=stop)
    if bus is None:
        await health.stop()
        return None, None
    return bus, health


async def _unless_stopped(work: Awaitable[T], *, stop: asyncio.Event) -> T | None:
    """`work`'s result, or None (and `work` cancelled) when `stop` is set first."""
    doing = asyncio.ensure_future(work)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([doing, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not doing.done():
        await cancel_and_wait(doing)
        return None
    return doing.result()


async def _serve(args: argparse.Namespace, *, config: AgentConfig, token: str | None, stop: asyncio.Event) -> int:
    """Serve until `stop` is set, then drain and close."""
    from rockbot.agent.approvals import BusApprover
    from rockbot.agent.budget import TokenBudget
    from rockbot.agent.inbox import serve_inbox
    from rockbot.agent.long_term_memory import BusMemoryDesk
    from rockbot.agent.recording import SessionHistory, bus_publisher
    from rockbot.agent.runtime import AgentRuntime
    from rockbot.agent.server import build_app
    from rockbot.agent.usage_reports import UsageReporter
    from rockbot.bus import BusUnavailable, MemoryBroker, Principal
    from rockbot.bus.admin import ensure_principal
    from rockbot.health import STOP_STEP_SECONDS, Readiness, stop_within, wait_for_dependency

    url = args.bus or os.environ.get(AMQP_URL_ENV)
    listener, waiting = _listen(args.host, args.port), None
    me = Principal.agent(namespace=config.namespace, name=config.name)
    if url == "memory":  # a broker of its own, where this agent is the one principal
        broker = MemoryBroker()
        await ensure_principal(broker, me, password="")
        bus = broker.connect(me.user)
        if "scripts" in config.builtin_tools:
            log.warning("--bus memory: no scripts-manager shares this process's bus, so execute_python_script answers "
                        "Unavailable at once; give --bus an AMQP URL with a scripts-manager on it to run scripts")
    elif url:
        bus, waiting = await _wait_for_broker(url, listener=listener, stop=stop)
        if bus is None:
            listener.close()
            return 0  # stopped before the broker answered
        if bus.user != me.user:
            await bus.close()
            await waiting.stop()
            listener.close()
            print(
                f"rockbot agent: the bus URL logs in as {bus.user!r}, but this agent is {me.user!r}: every agent has "
                f"a login of its own (the operator keeps it in the Secret rockbot-{config.name}-bus)",
                file=sys.stderr,
            )
            return 1
    else:
        bus = None
        log.warning("no bus configured (--bus or $%s): serving HTTP only, without inbox or scripts", AMQP_URL_ENV)
    reported = bus is not None and url != "memory"  # an operator on the bus keeps the Agent's day over replicas
    budget = TokenBudget(tokens_per_day=config.limits.tokens_per_day, reported=reported)
    runtime = AgentRuntime.from_config(
        config, bus=bus, sandbox=None if url == "memory" else _sandbox(bus, config), budget=budget,
        publish_runs=bus_publisher(bus) if reported else None,
        history=SessionHistory(bus=bus) if reported else None,
        memory_desk=BusMemoryDesk(bus=bus) if reported else None,
    )  # fmt: skip
    if reported:  # a person decides in the console, which is on the real bus only
        runtime.approvals.approver = BusApprover(bus=bus)
    readiness = Readiness()
    if bus is not None:
        readiness.waiting("inbox", "not consuming yet")
    runner = web.AppRunner(build_app(runtime=runtime, token=token, readiness=readiness,
                                     console_url=os.environ.get("ROCKBOT_CONSOLE_URL", "")), access_log=None)
    await runner.setup()
    await web.SockSite(runner, listener).start()  # closed with the runner
    if waiting is not None:
        await waiting.stop()  # after the agent's server serves the port: it is never closed in between
    port = runner.addresses[0][1]  # the bound one: `--port 0` asks the system for a free port
    log.info("agent %s/%s listening on %s:%d", config.namespace, config.name, args.host, port)
    subscription = reporting = None
    try:
        await runtime.start()
        if reported:
            reporter = UsageReporter(budget=budget, bus=bus, namespace=config.namespace, name=config.name)
            reporting = asyncio.create_task(reporter.run(), name="report token usage")
        if bus is not None:  # the broker may go away meanwhile: not ready, and trying again, until it is back
            subscription = await _unless_stopped(wait_for_dependency(
                lambda: serve_inbox(runtime=runtime, bus=bus), readiness=readiness, dependency="inbox",
                retry_on=(BusUnavailable,),
            ), stop=stop)  # fmt: skip
        await stop.wait()
        log.info("stopping: draining in-flight work for up to %g s", args.drain_seconds)
    finally:
        await cancel_and_wait(reporting)
        if subscription is not None:
            drain = args.drain_seconds
            await stop_within(drain + STOP_STEP_SECONDS, subscription.close(drain_seconds=drain), what="draining")
        await runner.cleanup()
        await stop_within(STOP_STEP_SECONDS, runtime.close(), what="closing the tools")
        if bus is not None:
            await stop_within(STOP_STEP_SECONDS, bus.close(), what="closing the broker connection")
    return 0


def _sandbox(bus, config: AgentConfig):
    """The scripts-manager client, when there is a bus to reach it."""
    if bus is None:
        return None
    from rockbot.agent.sandbox import ScriptSandbox

    return ScriptSandbox.for_agent(bus=bus, config=config)
