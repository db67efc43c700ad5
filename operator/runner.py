"""Start the operator: one API client, one registry of handlers, kopf configured for level-based work."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import urllib.parse
from typing import Any

import kopf

from rockbot.health import HealthServer, Readiness
from rockbot.kube.client import KubeClient
from rockbot.operator import handlers
from rockbot.operator.broker import register_broker
from rockbot.operator.egress_canary import EgressMetrics
from rockbot.operator.scheduling.handlers import register_scheduling
from rockbot.operator.scheduling.metrics import SchedulingMetrics
from rockbot.operator.settings import OperatorSettings

Flag = asyncio.Event | threading.Event | asyncio.Future[Any]
#: What readiness waits for until kopf has run every start-up handler.
STARTING = "operator"


def build_registry(
    runtime: handlers.Runtime, readiness: Readiness | None = None, metrics: SchedulingMetrics | None = None
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    readiness = readiness or Readiness()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf runs start-up and clean-up only: no resource handler, so it watches none of our kinds and
        # keeps no progress or diff-base annotations or finalizers on them (the watches are ours, see handlers).
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330

    handlers.register(registry, runtime)
    register_broker(registry, runtime, readiness=readiness)  # before scheduling, which logs in as the operator
    register_scheduling(registry, runtime, readiness=readiness, metrics=metrics, agents=runtime)

    @kopf.on.startup(registry=registry)
    def started(**_: Any) -> None:  # registered last: runs after every other startup handler
        readiness.done(STARTING)

    return registry


async def run_operator(
    settings: OperatorSettings,
    *,
    stop_flag: Flag | None = None,
    ready_flag: Flag | None = None,
    health_endpoint: str | None = None,
) -> None:
    """Run until stopped; watches `settings.namespaces`, or the whole cluster when empty.

    With `health_endpoint` (a URL), `/healthz`, `/readyz` and `/metrics` (the scheduler's and the egress
    canary's) are served on its host and port from the start, before kopf's own start-up, so a probe never
    finds the port closed while the operator waits for something.
    """
    readiness = Readiness()
    readiness.waiting(STARTING, "starting up")
    metrics = SchedulingMetrics()
    health = HealthServer(readiness=readiness, registry=metrics.registry)
    if health_endpoint:
        url = urllib.parse.urlsplit(health_endpoint)
        await health.start(host=url.hostname or "0.0.0.0", port=url.port or 8080)
    try:
        async with await KubeClient.from_environment() as kube:
            runtime = handlers.Runtime(settings=settings, kube=kube, registry=metrics.registry)
            if runtime.egress is not None:  # the agents' isolation gauges, beside the scheduler's
                metrics.registry.register(EgressMetrics(runtime.egress))
            await kopf.operator(
                registry=build_registry(runtime, readiness, metrics),
                standalone=True,
                clusterwide=not settings.namespaces,
                namespaces=settings.namespaces,
                stop_flag=stop_flag,
                ready_flag=ready_flag,
                identity=own_identity(),
            )
    finally:
        await health.stop()


def own_identity() -> str:
    """Who this operator is, for kopf: the pod's name (its hostname) and the process.

    Given so kopf does not derive it from `getpass.getuser()`, which fails for a uid with no passwd
    entry: the image's user 65532 has none.
    """
    return f"{socket.gethostname()}/{os.getpid()}"
