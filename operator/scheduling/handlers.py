"""kopf glue: start the scheduler, the agents' request consumer and their usage ledger with the operator, stop them
with it.

The scheduler watches ScheduledTasks itself (see `rockbot.kube.mirroring`) and follows the operator's watch of
Agents (one stream of Agent events for the whole operator), so kopf only owns its
lifetime: one `on.startup` and one `on.cleanup` handler on the operator's registry. The broker may
come up after the operator (a fresh `helm install`): scheduling then starts once it answers, the
operator meanwhile reconciles Agents and reports itself not ready, saying why. Stopping waits for
the broker only briefly, so SIGTERM ends the operator in seconds even when the broker is gone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import kopf

from rockbot.bus import AmqpBus, Bus
from rockbot.clock import Clock, SystemClock
from rockbot.health import STOP_STEP_SECONDS, Readiness, stop_within
from rockbot.kube import KubeClient
from rockbot.operator.evaluations import EvaluationRunner
from rockbot.operator.scheduling.agent_requests import SchedulingRequests
from rockbot.operator.scheduling.firing import Scheduler
from rockbot.operator.scheduling.loops import AgentFeed
from rockbot.operator.scheduling.metrics import SchedulingMetrics
from rockbot.operator.settings import OperatorSettings
from rockbot.operator.usage import UsageLedger
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class RuntimeLike(Protocol):
    settings: OperatorSettings
    kube: KubeClient


def register_scheduling(
    registry: kopf.OperatorRegistry,
    runtime: RuntimeLike,
    *,
    bus: Bus | None = None,
    clock: Clock | None = None,
    readiness: Readiness | None = None,
    metrics: SchedulingMetrics | None = None,
    agents: AgentFeed | None = None,
) -> None:
    """Fire ScheduledTasks and serve the agents' scheduling tools while the operator runs.

    `agents`: the operator's own watch of Agents, which the scheduler follows instead of watching them again.

    Without `bus`, the operator connects to `settings.amqp_url` after startup, retrying until the
    broker answers (`readiness` says so meanwhile); when that is not set (an operator run for
    Agents only), scheduling stays off and says so in the log.
    """
    parts: list[Scheduler | SchedulingRequests | UsageLedger | EvaluationRunner] = []
    opened: list[Bus] = []
    starting: list[asyncio.Task[None]] = []

    async def start(connection: Bus) -> None:
        now = clock or SystemClock()
        evaluations = EvaluationRunner(kube=runtime.kube, bus=connection, namespaces=runtime.settings.namespaces,
                                       registry=metrics.registry if metrics else None, clock=now,
                                       agents=agents)  # fmt: skip
        scheduler = Scheduler(kube=runtime.kube, bus=connection, clock=now, namespaces=runtime.settings.namespaces,
                              metrics=metrics, agents=agents, other_replies=evaluations.take_reply)
        requests = SchedulingRequests(kube=runtime.kube, bus=connection, clock=now)
        usage = UsageLedger(kube=runtime.kube, bus=connection)
        for part in (evaluations, scheduler, requests, usage):
            await part.start()
            parts.append(part)
        log.info("scheduling started")

    async def connect_then_start(url: str, readiness: Readiness) -> None:
        connection = await AmqpBus.connect_when_ready(url=url, readiness=readiness)
        opened.append(connection)
        try:
            await start(connection)
        except Exception as exc:  # the operator keeps reconciling; not ready says scheduling is down
            log.exception("scheduling failed to start")
            readiness.waiting("scheduling", f"failed to start: {exc!r}; restart the operator")

    @kopf.on.startup(registry=registry)
    async def start_scheduling(**_: Any) -> None:
        if bus is not None:
            await start(bus)
            return
        url = runtime.settings.amqp_url
        if not url:
            log.warning(
                "scheduling is off: amqp_url is not set, so ScheduledTasks will not fire "
                "and agents' scheduling tools get no answer; set ROCKBOT_AMQP_URL"
            )
            return
        connecting = connect_then_start(url, readiness or Readiness())
        starting.append(asyncio.create_task(connecting, name="connect to the broker"))

    @kopf.on.cleanup(registry=registry)
    async def stop_scheduling(**_: Any) -> None:
        await cancel_and_wait(*starting)
        await stop_within(STOP_STEP_SECONDS, _stop_parts(parts), what="stopping scheduling")
        # Always reached: a connection left open would go on reconnecting to a broker that is gone.
        await stop_within(STOP_STEP_SECONDS, _close(opened), what="closing the broker connection")


async def _stop_parts(parts: list[Scheduler | SchedulingRequests | UsageLedger | EvaluationRunner]) -> None:
    while parts:
        await parts.pop().stop()


async def _close(opened: list[Bus]) -> None:
    while opened:
        await opened.pop().close()
