"""Start the operator: one API client, one registry of handlers, kopf configured for level-based work."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import threading
import urllib.parse
from typing import Any

import kopf

from rockbot.conditions import ConditionUpdate
from rockbot.health import HealthServer, Readiness
from rockbot.kube.client import KubeClient
from rockbot.operator import handlers
from rockbot.operator.broker import register_broker
from rockbot.operator.egress_canary import EgressMetrics
from rockbot.operator.leadership import Leadership
from rockbot.operator.scheduling.handlers import register_scheduling
from rockbot.operator.scheduling.metrics import SchedulingMetrics
from rockbot.operator.settings import OperatorSettings
from rockbot.tasks import cancel_and_wait

Flag = asyncio.Event | threading.Event | asyncio.Future[Any]
#: What readiness waits for until kopf has run every start-up handler.
STARTING = "operator"
#: The exit code of a leader that lost its Lease.
LOST_LEADERSHIP_EXIT_CODE = 3
log = logging.getLogger(__name__)


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
            leadership, keeping = None, None
            if settings.leader_lease:
                leadership = Leadership(kube=kube, namespace=settings.leader_lease_namespace,
                                        name=settings.leader_lease, duration_seconds=settings.leader_lease_seconds,
                                        identity=f"{own_identity()}/{secrets.token_hex(4)}")
                if not await _stand_by(leadership, readiness=readiness, stop_flag=stop_flag):
                    return
                readiness.waiting(STARTING, "starting up as the leader")
                keeping = asyncio.create_task(_lead_or_exit(leadership), name="keep the leader Lease")
            try:
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
                if leadership is not None:
                    await cancel_and_wait(keeping)
                    await leadership.release()  # after kopf's clean-up: the next leader starts on a quiet field
    finally:
        await health.stop()


async def _stand_by(leadership: Leadership, *, readiness: Readiness, stop_flag: Flag | None) -> bool:
    """Wait to lead; False when stopped first (SIGTERM, SIGINT or `stop_flag`).

    A standby is ready (a rolling update waits for its new pods' readiness, and they stand by); `/readyz` says
    who leads. kopf handles signals once it runs; until then this does.
    """
    readiness.done(STARTING)
    readiness.condition(lambda: _leading(leadership))
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
    for signum in signals:
        loop.add_signal_handler(signum, stopped.set)
    acquiring = asyncio.ensure_future(leadership.acquire())
    stops = [asyncio.ensure_future(stopped.wait())]
    if stop_flag is not None:
        stops.append(asyncio.ensure_future(_flagged(stop_flag)))
    try:
        done, _ = await asyncio.wait([acquiring, *stops], return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(*stops)
        if not acquiring.done():
            await cancel_and_wait(acquiring)
        for signum in signals:
            loop.remove_signal_handler(signum)
    if done == {acquiring}:
        acquiring.result()  # an unexpected failure is raised
        return True
    if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
        await leadership.release()  # won and stopped at the same moment: hand it on
    return False


def _leading(leadership: Leadership) -> ConditionUpdate:
    if leadership.leader == leadership.identity:
        return ConditionUpdate(type="Leader", status="True", reason="LeaseHeld",
                               message=f"holds the Lease {leadership.namespace}/{leadership.name}")
    return ConditionUpdate(type="Leader", status="False", reason="StandingBy",
                           message=f"stands by; the Lease {leadership.namespace}/{leadership.name} is held by "
                           f"{leadership.leader or 'nobody yet'}")


async def _flagged(flag: Flag) -> None:
    if isinstance(flag, asyncio.Event):
        await flag.wait()
    elif isinstance(flag, threading.Event):
        while not await asyncio.to_thread(flag.wait, 0.5):
            pass
    else:
        await flag


async def _lead_or_exit(leadership: Leadership) -> None:
    """Renew the Lease; on losing it, end the process at once (its Deployment restarts it, as a standby).

    Not a graceful stop: a leader that lost the Lease may already have a successor, and every moment it goes on
    reconciling or firing is a moment two operators work.
    """
    why = await leadership.keep()
    log.critical("lost the leader Lease %s/%s (%s): exiting at once", leadership.namespace, leadership.name, why)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(LOST_LEADERSHIP_EXIT_CODE)


def own_identity() -> str:
    """Who this operator is, for kopf: the pod's name (its hostname) and the process.

    Given so kopf does not derive it from `getpass.getuser()`, which fails for a uid with no passwd
    entry: the image's user 65532 has none.
    """
    return f"{socket.gethostname()}/{os.getpid()}"
