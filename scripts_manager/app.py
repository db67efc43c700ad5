"""The scripts-manager process: bus, backend, consumer and health server, started and stopped together.

The health server comes first: while the broker is not reachable yet (or refuses the login, or
`script.invoke` is not declared: the operator creates the manager's user and the queue at its
start-up) the manager is live but not ready (`/readyz` says why) and keeps trying; SIGTERM stops it
at any point, within seconds even when the broker is gone.

When the cluster no longer accepts the manager's credentials (a job or the isolation canary met a 401: its pod
was force-deleted), `revoked` is set once the service has handed back what it had not started; the command then
stops as on SIGTERM and exits non-zero (cli.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from rockbot.bus import AmqpBus, Bus, NoRoute
from rockbot.conditions import ConditionUpdate
from rockbot.health import STOP_STEP_SECONDS, HealthServer, Readiness, stop_within, wait_for_dependency
from rockbot.reachability import CONDITION, IsolationMetrics
from rockbot.scripts_manager.backends import CredentialsRevoked, ScriptBackend
from rockbot.scripts_manager.canary import (
    CANARY_SECONDS,
    LOCAL_FIX,
    IsolationCanary,
    PostEvent,
    host_listeners,
    resolved,
)
from rockbot.scripts_manager.input_files import ConsoleInputs
from rockbot.scripts_manager.limits import AgentLimits, FixedLimits, MirroredAgents
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.output_files import ConsoleOutputs
from rockbot.scripts_manager.service import ScriptService
from rockbot.scripts_manager.settings import ScriptsManagerSettings, cpu_millicores
from rockbot.tasks import cancel_and_wait

if TYPE_CHECKING:
    from rockbot.kube.client import KubeClient

log = logging.getLogger("rockbot.scripts_manager")


def backend_name(settings: ScriptsManagerSettings) -> str:
    if settings.scripts_backend is not None:
        return settings.scripts_backend
    return "pods" if os.environ.get("KUBERNETES_SERVICE_HOST") else "local"


async def create_backend(
    *, settings: ScriptsManagerSettings, metrics: ScriptMetrics,
    on_revoked: Callable[[CredentialsRevoked], None] | None = None,
) -> tuple[ScriptBackend, IsolationCanary]:
    """The sandbox backend, and the isolation canary that runs on it (canary.py); `on_revoked` hears of a 401 that
    no job met (the pod backend's Lease)."""
    isolation = IsolationMetrics(registry=metrics.registry, scope="scripts")
    common = {"enforce": settings.scripts_isolation_enforce, "metrics": isolation,
              "interval_seconds": settings.scripts_isolation_interval_seconds}
    backend: ScriptBackend
    if backend_name(settings) == "pods":
        from rockbot.kube.client import KubeClient
        from rockbot.scripts_manager.backends.pods import PodBackend
        from rockbot.scripts_manager.policy_watch import PolicyWatch

        kube = await KubeClient.from_environment()
        backend = PodBackend(kube=kube, settings=settings, metrics=metrics, on_revoked=on_revoked)
        targets = settings.isolation_targets
        return backend, IsolationCanary(
            backend=backend, targets=lambda: resolved(targets),
            post_event=namespace_events(kube, namespace=settings.scripts_namespace),
            changes=PolicyWatch(kube=kube, namespace=settings.scripts_namespace),
            debounce_seconds=settings.scripts_isolation_debounce_seconds,
            cpu=min(settings.scripts_isolation_cpu, settings.scripts_cpu, key=cpu_millicores),
            first_proof_seconds=settings.scripts_pod_start_seconds + 2 * CANARY_SECONDS, **common,
        )  # fmt: skip
    from rockbot.scripts_manager.backends.local import LocalBackend

    backend = await LocalBackend.create(settings=settings)
    return backend, IsolationCanary(backend=backend, targets=host_listeners, first_proof_seconds=2 * CANARY_SECONDS,
                                    sandboxes="local scripts", fix=LOCAL_FIX, **common)


def namespace_events(kube: KubeClient, *, namespace: str) -> PostEvent:
    """The canary's Events, on the scripts namespace itself (the manager's Role allows events create there)."""
    from rockbot.kube.events import EventPoster

    post = EventPoster(kube, component="rockbot-scripts-manager")
    about = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "namespace": namespace}}

    async def post_event(kind: str, reason: str, message: str, annotations: dict[str, str]) -> None:
        await post(about, kind, reason, message, annotations)  # type: ignore[arg-type]

    return post_event


class ScriptsManager:
    """Everything one `rockbot scripts-manager` process runs; `bus` is given in tests and local mode, `limits`
    (each agent's script limits) by `rockbot local`, else they come from ROCKBOT_SCRIPTS_AGENT_LIMITS."""

    def __init__(
        self, *, settings: ScriptsManagerSettings, bus: Bus | None = None, limits: AgentLimits | None = None
    ) -> None:
        self.settings = settings
        self._limits = limits
        self._mirror: MirroredAgents | None = None
        self.metrics = ScriptMetrics(backend=backend_name(settings))
        self._bus = bus
        self._own_bus = bus is None
        self._backend: ScriptBackend | None = None
        self._service: ScriptService | None = None
        self.canary: IsolationCanary | None = None
        self._canary_task: asyncio.Task[None] | None = None
        #: Set when the cluster refused this process's credentials: it takes no more scripts and must stop.
        self.revoked = asyncio.Event()
        self.readiness = Readiness()
        self.readiness.check(self._consuming)
        self.readiness.check(lambda: self.canary.not_ready() if self.canary is not None else None)
        self.readiness.condition(self._isolation)
        self.health = HealthServer(readiness=self.readiness, registry=self.metrics.registry)

    def _isolation(self) -> ConditionUpdate:
        if self.canary is None:
            return ConditionUpdate(type=CONDITION, status="Unknown", reason="Starting",
                                   message="the sandbox is starting")
        return self.canary.condition()

    def _consuming(self) -> str | None:
        return None if self._service is not None and self._service.consuming else "not consuming script requests"

    async def start(self) -> None:
        settings = self.settings
        await self.health.start(host=settings.health_host, port=settings.health_port)
        self._backend, self.canary = await create_backend(settings=settings, metrics=self.metrics,
                                                          on_revoked=self._revoke)
        await self._backend.start()
        self._canary_task = asyncio.create_task(self._prove(self.canary), name="isolation canary")
        if self._bus is None:
            if settings.amqp_url is None:
                raise ValueError("ROCKBOT_AMQP_URL is not set: the scripts-manager needs the broker's URL")
            url = settings.amqp_url.get_secret_value()
            self._bus = await AmqpBus.connect_when_ready(url=url, readiness=self.readiness)
        limits = self._limits or await self._agent_limits()
        outputs = ConsoleOutputs(self._bus, inline_bytes=settings.output_bounds.total_bytes)
        self._service = ScriptService(bus=self._bus, backend=self._backend, settings=settings, metrics=self.metrics,
                                      limits=limits, isolation=self.canary, inputs=ConsoleInputs(self._bus),
                                      outputs=outputs, on_revoked=lambda _: self.revoked.set())  # fmt: skip
        await wait_for_dependency(
            self._service.start, readiness=self.readiness, dependency="script.invoke", retry_on=(NoRoute,)
        )
        log.info("scripts-manager consuming with backend %s, concurrency %d, health on port %s",
                 self.metrics.backend, settings.scripts_concurrency, self.health.port)

    async def _prove(self, canary: IsolationCanary) -> None:
        """The isolation canary, until cancelled; one that met revoked credentials revokes the whole manager."""
        try:
            await canary.run()
        except CredentialsRevoked as exc:
            self._revoke(exc)

    def _revoke(self, exc: CredentialsRevoked) -> None:
        """The cluster refused this process's credentials: the service hands back what it took (then `revoked`)."""
        if self._service is not None:
            self._service.revoke(exc)
        elif not self.revoked.is_set():
            log.critical("%s; this scripts-manager stops before it took any script", exc)
            self.revoked.set()

    async def _agent_limits(self) -> AgentLimits:
        """ROCKBOT_SCRIPTS_AGENT_LIMITS: the Agents' own (mirrored before any request is taken), or the defaults."""
        if self.settings.scripts_agent_limits == "defaults":
            return FixedLimits.defaults(self.settings)
        from rockbot.kube.client import KubeClient

        kube = await KubeClient.from_environment()
        self._mirror = MirroredAgents(kube=kube, namespaces=self.settings.namespaces)
        await wait_for_dependency(self._mirror.start, readiness=self.readiness, dependency="Agents",
                                  retry_on=())  # the mirror retries by itself until the API answers
        return self._mirror

    async def stop(self) -> None:
        """Stop taking requests, give in-flight scripts ROCKBOT_DRAIN_SECONDS, then close everything."""
        drain = self.settings.drain_seconds
        if self._service is not None:
            await stop_within(drain + STOP_STEP_SECONDS, self._service.stop(drain_seconds=drain),
                              what="draining script requests")
        if self._mirror is not None:
            await self._mirror.stop()
            await stop_within(STOP_STEP_SECONDS, self._mirror.kube.close(), what="closing the API client")
        await cancel_and_wait(self._canary_task)
        if self._backend is not None:
            await stop_within(STOP_STEP_SECONDS, self._backend.close(), what="closing the sandbox backend")
        if self._own_bus and self._bus is not None:
            await stop_within(STOP_STEP_SECONDS, self._bus.close(), what="closing the broker connection")
        await self.health.stop()

