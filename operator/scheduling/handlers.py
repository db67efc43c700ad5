"""kopf glue: start the scheduler and the agents' request consumer with the operator, stop them with it.

The scheduler watches ScheduledTasks and Agents itself (see `watching`), so kopf only owns its
lifetime: one `on.startup` and one `on.cleanup` handler on the operator's registry.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import kopf

from rockbot.bus import AmqpBus, Bus
from rockbot.kube import KubeClient
from rockbot.operator.scheduling.agent_requests import SchedulingRequests
from rockbot.operator.scheduling.clock import Clock, SystemClock
from rockbot.operator.scheduling.firing import Scheduler
from rockbot.operator.settings import OperatorSettings

log = logging.getLogger(__name__)


class RuntimeLike(Protocol):
    settings: OperatorSettings
    kube: KubeClient


def register_scheduling(
    registry: kopf.OperatorRegistry, runtime: RuntimeLike, *, bus: Bus | None = None, clock: Clock | None = None
) -> None:
    """Fire ScheduledTasks and serve the agents' scheduling tools while the operator runs.

    Without `bus`, the operator connects to `settings.amqp_url` at startup; when that is not set
    (an operator run for Agents only), scheduling stays off and says so in the log.
    """
    parts: list[Scheduler | SchedulingRequests] = []
    opened: list[Bus] = []

    @kopf.on.startup(registry=registry)
    async def start_scheduling(**_: Any) -> None:
        connection = bus
        if connection is None:
            url = runtime.settings.amqp_url
            if not url:
                log.warning(
                    "scheduling is off: amqp_url is not set, so ScheduledTasks will not fire "
                    "and agents' scheduling tools get no answer; set ROCKBOT_AMQP_URL"
                )
                return
            connection = await AmqpBus.connect(url=url)
            opened.append(connection)
        now = clock or SystemClock()
        scheduler = Scheduler(kube=runtime.kube, bus=connection, clock=now, namespaces=runtime.settings.namespaces)
        requests = SchedulingRequests(kube=runtime.kube, bus=connection, clock=now)
        for part in (scheduler, requests):
            await part.start()
            parts.append(part)
        log.info("scheduling started")

    @kopf.on.cleanup(registry=registry)
    async def stop_scheduling(**_: Any) -> None:
        while parts:
            await parts.pop().stop()
        while opened:
            await opened.pop().close()
