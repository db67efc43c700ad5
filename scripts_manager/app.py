"""The scripts-manager process: bus, backend, consumer and health server, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
import os

from rockbot.bus import AmqpBus, Bus
from rockbot.scripts_manager.backends import ScriptBackend
from rockbot.scripts_manager.health import HealthServer
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
        self.health = HealthServer(
            registry=self.metrics.registry, ready=lambda: self._service is not None and self._service.consuming
        )

    async def start(self) -> None:
        settings = self.settings
        await self.health.start(host=settings.health_host, port=settings.health_port)
        self._backend = await create_backend(settings=settings, metrics=self.metrics)
        await self._backend.start()
        if self._bus is None:
            if settings.amqp_url is None:
                raise ValueError("ROCKBOT_AMQP_URL is not set: the scripts-manager needs the broker's URL")
            self._bus = await AmqpBus.connect(url=settings.amqp_url.get_secret_value())
        self._service = ScriptService(bus=self._bus, backend=self._backend, settings=settings, metrics=self.metrics)
        await self._service.start()
        log.info("scripts-manager consuming with backend %s, concurrency %d, health on port %s",
                 self.metrics.backend, settings.scripts_concurrency, self.health.port)

    async def stop(self) -> None:
        """Stop taking requests, give in-flight scripts ROCKBOT_DRAIN_SECONDS, then close everything."""
        if self._service is not None:
            await self._service.stop(drain_seconds=self.settings.drain_seconds)
        if self._backend is not None:
            await self._backend.close()
        if self._own_bus and self._bus is not None:
            await self._bus.close()
        await self.health.stop()


async def serve(*, settings: ScriptsManagerSettings, stop: asyncio.Event) -> None:
    manager = ScriptsManager(settings=settings)
    try:
        await manager.start()
        await stop.wait()
    finally:
        await manager.stop()
