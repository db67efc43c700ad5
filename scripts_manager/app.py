"""The scripts-manager process: bus, backend, consumer and health server, started and stopped together.

The health server comes first: while the broker is not reachable yet (or refuses the login, or
`script.invoke` is not declared: the operator creates the manager's user and the queue at its
start-up) the manager is live but not ready (`/readyz` says why) and keeps trying; SIGTERM stops it
at any point, within seconds even when the broker is gone.
"""

from __future__ import annotations

import logging
import os

from rockbot.bus import AmqpBus, Bus, NoRoute
from rockbot.health import STOP_STEP_SECONDS, HealthServer, Readiness, stop_within, wait_for_dependency
from rockbot.scripts_manager.backends import ScriptBackend
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.service import ScriptService
from rockbot.scripts_manager.settings import ScriptsManagerSettings

log = logging.getLogger("rockbot.scripts_manager")


def backend_name(settings: ScriptsManagerSettings) -> str:
    if settings.scripts_backend is not None:
        return settings.scripts_backend
    return "pods" if os.environ.get("KUBERNETES_SERVICE_HOST") else "local"


async def create_backend(*, settings: ScriptsManagerSettings, metrics: ScriptMetrics) -> ScriptBackend:
    if backend_name(settings) == "pods":
        from rockbot.kube.client import KubeClient
        from rockbot.scripts_manager.backends.pods import PodBackend

        return PodBackend(kube=await KubeClient.from_environment(), settings=settings, metrics=metrics)
    from rockbot.scripts_manager.backends.local import LocalBackend

    return await LocalBackend.create(settings=settings)


class ScriptsManager:
    """Everything one `rockbot scripts-manager` process runs; `bus` is given in tests and local mode."""

    def __init__(self, *, settings: ScriptsManagerSettings, bus: Bus | None = None) -> None:
        self.settings = settings
        self.metrics = ScriptMetrics(backend=backend_name(settings))
        self._bus = bus
        self._own_bus = bus is None
        self._backend: ScriptBackend | None = None
        self._service: ScriptService | None = None
        self.readiness = Readiness()
        self.readiness.check(self._consuming)
        self.health = HealthServer(readiness=self.readiness, registry=self.metrics.registry)

    def _consuming(self) -> str | None:
        return None if self._service is not None and self._service.consuming else "not consuming script requests"

    async def start(self) -> None:
        settings = self.settings
        await self.health.start(host=settings.health_host, port=settings.health_port)
        self._backend = await create_backend(settings=settings, metrics=self.metrics)
        await self._backend.start()
        if self._bus is None:
            if settings.amqp_url is None:
                raise ValueError("ROCKBOT_AMQP_URL is not set: the scripts-manager needs the broker's URL")
            url = settings.amqp_url.get_secret_value()
            self._bus = await AmqpBus.connect_when_ready(url=url, readiness=self.readiness)
        self._service = ScriptService(bus=self._bus, backend=self._backend, settings=settings, metrics=self.metrics)
        await wait_for_dependency(
            self._service.start, readiness=self.readiness, dependency="script.invoke", retry_on=(NoRoute,)
        )
        log.info("scripts-manager consuming with backend %s, concurrency %d, health on port %s",
                 self.metrics.backend, settings.scripts_concurrency, self.health.port)

    async def stop(self) -> None:
        """Stop taking requests, give in-flight scripts ROCKBOT_DRAIN_SECONDS, then close everything."""
        drain = self.settings.drain_seconds
        if self._service is not None:
            await stop_within(drain + STOP_STEP_SECONDS, self._service.stop(drain_seconds=drain),
                              what="draining script requests")
        if self._backend is not None:
            await stop_within(STOP_STEP_SECONDS, self._backend.close(), what="closing the sandbox backend")
        if self._own_bus and self._bus is not None:
            await stop_within(STOP_STEP_SECONDS, self._bus.close(), what="closing the broker connection")
        await self.health.stop()

