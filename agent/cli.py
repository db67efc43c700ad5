"""`rockbot agent --config FILE`: run one agent: its inbox on the bus and its HTTP endpoint.

The config is the YAML/JSON document the operator renders into the agent's ConfigMap. The bus is
RabbitMQ at `--bus URL` (default: `$ROCKBOT_AMQP_URL`), or `--bus memory` for a self-contained
process (no inbox from outside, no scripts-manager). SIGTERM drains: the inbox stops taking
messages, in-flight turns get `--drain-seconds` to finish (unfinished ones are redelivered to the
next pod), then the HTTP server and connections close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import yaml
from aiohttp import web
from pydantic import ValidationError

from rockbot.contracts.agent_config import AMQP_URL_ENV, AgentConfig
from rockbot.logs import setup_logging

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
    return asyncio.run(_serve(args, config=config, token=token))


async def _connect_bus(url: str | None):
    from rockbot.bus import AmqpBus, MemoryBus

    if url == "memory":
        return MemoryBus()
    if not url:
        return None
    return await AmqpBus.connect(url=url)


async def _serve(args: argparse.Namespace, *, config: AgentConfig, token: str | None) -> int:
    from rockbot.agent.inbox import serve_inbox
    from rockbot.agent.runtime import AgentRuntime
    from rockbot.agent.server import build_app
    from rockbot.bus import BusUnavailable

    try:
        bus = await _connect_bus(args.bus or os.environ.get(AMQP_URL_ENV))
    except BusUnavailable as exc:
        print(f"rockbot agent: {exc}", file=sys.stderr)
        return 1
    if bus is None:
        log.warning("no bus configured (--bus or $%s): serving HTTP only, without inbox or scripts", AMQP_URL_ENV)
    runtime = AgentRuntime.from_config(config, bus=bus, sandbox=_sandbox(bus, config))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(build_app(runtime=runtime, token=token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    port = runner.addresses[0][1]  # the bound one: `--port 0` asks the system for a free port
    log.info("agent %s/%s listening on %s:%d", config.namespace, config.name, args.host, port)
    subscription = None
    try:
        await runtime.start()
        if bus is not None:
            subscription = await serve_inbox(runtime=runtime, bus=bus)
        await stop.wait()
        log.info("stopping: draining in-flight work for up to %g s", args.drain_seconds)
    finally:
        if subscription is not None:
            await subscription.close(drain_seconds=args.drain_seconds)
        await runner.cleanup()
        await runtime.close()
        if bus is not None:
            await bus.close()
    return 0


def _sandbox(bus, config: AgentConfig):
    """The scripts-manager client, when there is a bus to reach it."""
    if bus is None:
        return None
    from rockbot.agent.sandbox import ScriptSandbox

    return ScriptSandbox.for_agent(bus=bus, config=config)
