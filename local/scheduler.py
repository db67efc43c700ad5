"""Fire ScheduledTask manifests locally: the same cron semantics as the operator, without a status to keep.

Each task sends its prompt to the agent's inbox over the bus at every slot, like the operator does;
`concurrencyPolicy` is honoured, `suspend` skips, `runOnce` stops after one run. Missed slots are not
caught up: nothing ran before this process started.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
import uuid
from collections.abc import Callable

from rockbot.bus import Bus, Principal
from rockbot.bus.topology import agent_inbox, local_scheduler_replies
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.local.manifests import NAMESPACE
from rockbot.operator.scheduling.cron import CronSchedule
from rockbot.resources import ScheduledTask

logger = logging.getLogger(__name__)
Report = Callable[[str, InboxReply | None, str | None], None]


class LocalScheduler:
    """One asyncio task per ScheduledTask; `close()` stops them all."""

    def __init__(self, *, bus: Bus, tasks: list[ScheduledTask], report: Report) -> None:
        self._bus = bus
        self._tasks = tasks
        self._report = report
        self._loops: list[asyncio.Task[None]] = []
        #: Per process: two `rockbot local` runs on one broker must not take each other's replies.
        self._replies = local_scheduler_replies(instance=secrets.token_hex(4))

    def start(self) -> None:
        for task in self._tasks:
            schedule = CronSchedule.parse(schedule=task.spec.schedule, time_zone=task.spec.time_zone)
            self._loops.append(asyncio.create_task(self._fire_forever(task, schedule)))

    async def close(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    async def _fire_forever(self, task: ScheduledTask, schedule: CronSchedule) -> None:
        running: set[asyncio.Task[None]] = set()
        instant = datetime.datetime.now(datetime.UTC)
        while True:
            instant = schedule.next_after(instant)
            delay = (instant - datetime.datetime.now(datetime.UTC)).total_seconds()
            await asyncio.sleep(max(0.0, delay))
            if task.spec.suspend:
                continue
            policy = task.spec.concurrency_policy
            if running and policy == "Forbid":
                self._report(task.metadata["name"], None, "skipped: the previous run is still going (Forbid)")
                continue
            if running and policy == "Replace":
                for run in running:
                    run.cancel()
            run = asyncio.create_task(self._run(task, instant))
            running.add(run)
            run.add_done_callback(running.discard)
            if task.spec.run_once:
                await asyncio.gather(run, return_exceptions=True)
                return

    async def _run(self, task: ScheduledTask, instant: datetime.datetime) -> None:
        name = task.metadata["name"]
        request = InboxRequest(
            kind="scheduled_task",
            request_id=f"{name}-{instant:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}",
            session_id=f"task-{name}",
            content=task.spec.prompt,
            reply_to=self._replies.name,
        )
        try:
            delivery = await self._bus.request(
                queue=agent_inbox(namespace=NAMESPACE, name=task.spec.agent_ref.name),
                body=request,
                reply_queue=self._replies,
                correlation_id=request.request_id,
                timeout_seconds=task.spec.run_timeout_seconds,
                responder=Principal.agent(namespace=NAMESPACE, name=task.spec.agent_ref.name),
            )
            self._report(name, delivery.decode(InboxReply), None)
        except Exception as error:  # a failed run is reported, and the next slot still fires
            self._report(name, None, f"failed: {error}")
