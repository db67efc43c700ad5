"""Liveness and readiness for every process, over HTTP (`/healthz`, `/readyz`, optionally `/metrics`).

A dependency that is not reachable yet (the broker still starting after `helm install`) makes a
process not ready, never dead: liveness answers as long as the event loop does, while the process
retries; `/readyz` answers 503 with what it waits for and why, for `kubectl describe pod`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from rockbot.conditions import ConditionUpdate

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Pauses between attempts to reach a dependency; the last one repeats.
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0)


class Readiness:
    """What the process still waits for, by dependency; ready when nothing is pending and every check passes."""

    def __init__(self) -> None:
        self._pending: dict[str, str] = {}
        self._checks: list[Callable[[], str | None]] = []
        self._conditions: list[Callable[[], ConditionUpdate]] = []

    def waiting(self, dependency: str, why: str) -> None:
        self._pending[dependency] = why

    def done(self, dependency: str) -> None:
        self._pending.pop(dependency, None)

    def check(self, probe: Callable[[], str | None]) -> None:
        """Add a live check: it returns None when all is well, else why the process is not ready."""
        self._checks.append(probe)

    def condition(self, report: Callable[[], ConditionUpdate]) -> None:
        """Add a condition `/readyz` always shows (one line each, ready or not), such as EgressRestricted."""
        self._conditions.append(report)

    def conditions(self) -> list[str]:
        return [f"{c.type}={c.status} ({c.reason}): {c.message}" for c in (report() for report in self._conditions)]

    def reasons(self) -> list[str]:
        found = [f"{dependency}: {why}" for dependency, why in self._pending.items()]
        return found + [reason for probe in self._checks if (reason := probe()) is not None]


async def wait_for_dependency(
    connect: Callable[[], Awaitable[T]],
    *,
    readiness: Readiness,
    dependency: str,
    retry_on: tuple[type[BaseException], ...],
) -> T:
    """`connect()` until it succeeds; meanwhile `readiness` says why (the error) and when the next try is."""
    attempt = 0
    readiness.waiting(dependency, "connecting")
    while True:
        try:
            result = await connect()
        except retry_on as exc:
            delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
            attempt += 1
            readiness.waiting(dependency, f"{exc} (attempt {attempt}, next in {delay:g} s)")
            log.warning("%s not reachable yet (%s); trying again in %g s", dependency, exc, delay)
            await asyncio.sleep(delay)
            continue
        readiness.done(dependency)
        if attempt:
            log.info("%s reachable after %d failed attempts", dependency, attempt)
        return result


class HealthServer:
    """Live while the event loop answers; ready as `readiness` says; Prometheus metrics when given a registry."""

    def __init__(self, *, readiness: Readiness, registry: CollectorRegistry | None = None) -> None:
        self.readiness = readiness
        self._registry = registry
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, *, host: str = "", port: int = 0, sock: socket.socket | None = None) -> None:
        """Listen on `host` and `port`, or serve on `sock`, a listening socket (closed when this server stops)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if self._registry is not None:
            app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.SockSite(self._runner, sock) if sock is not None else web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        reasons = self.readiness.reasons()
        conditions = "".join(f"{line}\n" for line in self.readiness.conditions())
        if not reasons:
            return web.Response(text="ready\n" + conditions)
        return web.Response(status=503, text="not ready: " + "; ".join(reasons) + "\n" + conditions)

    async def _metrics(self, request: web.Request) -> web.Response:
        assert self._registry is not None
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def stop_on_signals() -> asyncio.Event:
    """An event the running loop sets on SIGTERM or SIGINT: what every process stops on."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def serve_until_signalled(service: Service) -> None:
    """Run `service` until SIGTERM or SIGINT, also while it is still starting (waiting for the broker); a
    start-up error ends it. It is stopped on every path."""
    stop = stop_on_signals()
    starting = asyncio.create_task(service.start())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()
            await stopping
    finally:
        for task in (starting, stopping):
            task.cancel()
        await asyncio.gather(starting, stopping, return_exceptions=True)
        await service.stop()


#: How long one step of a shutdown may take: several fit in a pod's default 30 s grace period.
STOP_STEP_SECONDS = 5.0


async def stop_within(seconds: float, step: Awaitable[object], *, what: str) -> None:
    """Await one step of a shutdown for at most `seconds`: a dependency that is gone must not hold SIGTERM.

    A step that times out is cancelled and logged; the shutdown goes on with the next step.
    """
    try:
        async with asyncio.timeout(seconds):
            await step
    except TimeoutError:
        log.warning("%s did not finish within %g s; stopping without it", what, seconds)
