"""The firing loop: one asyncio task per ScheduledTask, sleeping on the clock until its next instant.

Each loop plans from the latest copy of its task, writes the planned status conditionally on the
resourceVersion it planned from, and only then publishes the trigger to the agent's inbox. A
second replica or a restarted operator planning the same slot from the same version loses the
write (409), reads again, sees the slot taken and publishes nothing. Replies arrive on one shared
queue; a reply for a run that is no longer active (timed out, replaced, answered twice) is ignored.

Exactly once is "recorded, then delivered at least once, run once": a step (plan, write, publish)
is shielded from cancellation, and whenever a loop starts or recovers from an error (a crash, a
stop or a lost write answer may have come between the write and the publish) it publishes again
every run its status holds active, with the same request id. The agent's inbox answers a copy of a
request id it has seen with the remembered reply, so the model runs once. That memory lives in
the agent process: an agent that restarts between the two copies runs the prompt again.

Loops are supervised (`loops.ObjectLoops`): an error ends a step, never the loop; it is logged (with a
traceback when it is not a known API, HTTP or bus failure) and the step is tried again after a growing pause.

Sending a run is a span (`scheduled run`, with the run id of `status.history`), parent of the agent's
turn: a run's whole trace is found by its id. Each run recorded in a history is counted by outcome
(`SchedulingMetrics`), and one Missed or Failed is a Warning Event on the task (reason `RunMissed`,
`RunFailed`): `kubectl get events --field-selector reason=RunFailed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rockbot import runs
from rockbot.bus import BadMessage, Bus, BusError, Delivery, Principal, Subscription
from rockbot.bus.topology import OPERATOR_RUNS, agent_inbox
from rockbot.clock import Clock
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.kube import AGENTS, SCHEDULED_TASKS, Conflict, KubeClient, NotFound
from rockbot.kube.events import EventPoster
from rockbot.operator.builders import MANAGED_BY
from rockbot.operator.scheduling.loops import AgentFeed, Key, LoopState, Next, ObjectLoops, agent_of
from rockbot.operator.scheduling.metrics import SchedulingMetrics
from rockbot.operator.scheduling.planning import KIND, AgentState, Trigger, active_triggers, complete_run, plan_task
from rockbot.resources import GROUP, VERSION
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

WRITE_ATTEMPTS = 5


class Scheduler:
    """Fires every ScheduledTask in `namespaces` (all when empty); `start()` then `stop()`."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        bus: Bus,
        clock: Clock,
        namespaces: list[str] | None = None,
        metrics: SchedulingMetrics | None = None,
        agents: AgentFeed | None = None,
        other_replies: Callable[[InboxReply, Principal | None], bool] | None = None,
    ) -> None:
        """`agents`: where the Agents come from when something else watches them already; else watched here.
        `other_replies`: takes the replies on the runs queue that are not scheduled runs' (an Evaluation's)."""
        self._kube = kube
        self._other_replies = other_replies
        self._bus = bus
        self._clock = clock
        self.metrics = metrics or SchedulingMetrics()
        self._post_event = EventPoster(kube, component=MANAGED_BY)
        # Each step is shielded: a status write is followed by the publish of what it records.
        self._loops = ObjectLoops(kube=kube, resource=SCHEDULED_TASKS, kind="ScheduledTask", namespaces=namespaces,
                                  clock=clock, step=self._step, logger=log, agents=agents,
                                  on_agent=self._agent_changed, on_agent_deleted=self._agent_deleted,
                                  shielded=True, wake_in_backoff=True)  # fmt: skip
        self._tasks = self._loops.states
        self._agents: dict[Key, AgentState] = {}
        self._replies: Subscription | None = None

    async def start(self) -> None:
        self._replies = await self._bus.consume(queue=OPERATOR_RUNS, handler=self._on_reply, prefetch=16)
        await self._loops.start()

    async def stop(self) -> None:
        if self._replies is not None:
            await self._replies.close()
            self._replies = None
        await self._loops.stop()

    # ---- the mirror's callbacks

    def _task_changed(self, body: dict[str, Any]) -> None:
        self._loops.seen(body)

    def _agent_changed(self, body: dict[str, Any]) -> None:
        metadata = body["metadata"]
        state = AgentState.of(body)
        key = (metadata["namespace"], metadata["name"])
        if self._agents.get(key) != state:
            self._agents[key] = state
            self._loops.wake_referrers(key)

    def _agent_deleted(self, namespace: str, name: str) -> None:
        self._agents[(namespace, name)] = AgentState(exists=False)
        self._loops.wake_referrers((namespace, name))

    # ---- one step of a task's loop

    async def _step(self, key: Key, state: LoopState) -> Next:
        """Plan once; write; publish (after a failure or at start: every active run). Returns when to plan again."""
        while True:
            body = state.body
            agent = await self._agent_state(key[0], agent_of(body))
            plan = plan_task(body=body, agent=agent, now=self._clock.now())
            if plan.status is not None:
                try:
                    state.body = await self._write_status(body, plan.status)
                except Conflict:
                    state.body = await self._kube.get(SCHEDULED_TASKS, namespace=key[0], name=key[1])
                    continue
            triggers = active_triggers(body=state.body) if state.recovering else plan.triggers
            for trigger in triggers:
                await self._publish(state, trigger, again=state.recovering)
            state.recovering = False
            return False, plan.wake_at

    async def _agent_state(self, namespace: str, name: str) -> AgentState:
        known = self._agents.get((namespace, name))
        if known is not None:
            return known
        try:
            body = await self._kube.get(AGENTS, namespace=namespace, name=name)
        except NotFound:
            return AgentState(exists=False)
        self._agent_changed(body)
        return self._agents[(namespace, name)]

    async def _publish(self, state: LoopState, trigger: Trigger, *, again: bool = False) -> None:
        """Send the run to the agent's inbox in its span (the agent's turn is its child); `again`: a resend."""
        request = InboxRequest(
            kind="scheduled_task",
            request_id=trigger.request_id,
            session_id=trigger.request_id,
            content=trigger.prompt,
            reply_to=OPERATOR_RUNS.name,
        )
        try:
            with tracer.start_as_current_span("scheduled run", attributes={
                "rockbot.scheduledtask": f"{trigger.namespace}/{trigger.task}", "rockbot.run.id": trigger.run_id,
                "rockbot.request.id": trigger.request_id, "gen_ai.agent.name": trigger.agent,
                "rockbot.run.scheduled_time": trigger.scheduled_time.isoformat(), "rockbot.run.resent": again,
            }):  # fmt: skip
                await self._bus.publish(
                    queue=agent_inbox(namespace=trigger.namespace, name=trigger.agent),
                    body=request,
                    message_id=trigger.request_id,
                    correlation_id=trigger.request_id,
                    reply_to=OPERATOR_RUNS.name,
                )
            if not again:
                self.metrics.lag.observe(max(0.0, (self._clock.now() - trigger.scheduled_time).total_seconds()))
        except BusError as exc:
            log.warning("could not send run %s to agent %s: %s", trigger.run_id, trigger.agent, exc)
            await self._complete(
                trigger.namespace,
                trigger.task,
                trigger.run_id,
                answer=None,
                error=f"could not deliver the trigger to the agent's inbox: {exc}",
            )

    # ---- completing runs

    async def _on_reply(self, delivery: Delivery) -> None:
        try:
            reply = delivery.decode(InboxReply)
        except BadMessage as exc:
            log.warning("dropping an unreadable run reply: %s", exc)
            return
        if self._other_replies is not None and self._other_replies(reply, delivery.sender):
            return
        parsed = runs.parse_request_id(reply.request_id, kind=KIND)
        if parsed is None:
            log.warning("dropping a reply for %r, which is not a scheduled run", reply.request_id)
            return
        namespace, task, run = parsed
        answer, error = runs.outcome_of(reply)
        await self._complete(namespace, task, run, answer=answer, error=error, sender=delivery.sender,
                             agent_run=reply.run_id or "")

    async def _complete(
        self, namespace: str, task: str, run: str, *, answer: str | None, error: str | None,
        sender: Principal | None = None, agent_run: str = "",
    ) -> None:
        """Record the run's outcome; `sender`, when the outcome is an agent's reply, must be the task's agent."""
        for _ in range(WRITE_ATTEMPTS):
            try:
                body = await self._kube.get(SCHEDULED_TASKS, namespace=namespace, name=task)
            except NotFound:
                return
            if not runs.belongs_to(run, uid=str(body["metadata"].get("uid", ""))):
                return  # a run of an earlier task by the same name
            agent = Principal.agent(namespace=namespace, name=body["spec"]["agentRef"]["name"])
            if sender is not None and sender != agent:
                log.warning("ignoring %s's reply to run %s of %s/%s: the run was sent to %s",
                            sender, run, namespace, task, agent)
                return
            status = complete_run(body=body, run_id=run, now=self._clock.now(), answer=answer, error=error,
                                  agent_run=agent_run)
            if status is None:
                return
            try:
                written = await self._write_status(body, status)
            except Conflict:
                continue
            self._task_changed(written)
            return
        raise Conflict(status=409, reason="Conflict", message=f"run {run} not recorded after {WRITE_ATTEMPTS} tries")

    async def _write_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource, only if the object is still at the version planned from; the runs
        it records for the first time are counted, and a Missed or Failed one is a Warning Event on the task."""
        metadata = body["metadata"]
        previous = body.get("status") or {}
        patch = {key: None for key in previous if key not in status} | status
        written = await self._kube.patch(
            SCHEDULED_TASKS,
            namespace=metadata["namespace"],
            name=metadata["name"],
            subresource="status",
            body={"metadata": {"resourceVersion": metadata["resourceVersion"]}, "status": patch},
        )
        for record in recorded(before=previous, after=written.get("status") or {}):
            self.metrics.runs.labels(record["outcome"]).inc()
            if record["outcome"] in RUN_EVENTS:
                reason, verb = RUN_EVENTS[record["outcome"]]
                await self._post_event(
                    {"apiVersion": written.get("apiVersion") or f"{GROUP}/{VERSION}", "kind": "ScheduledTask",
                     "metadata": written["metadata"]}, "Warning", reason,
                    f"run {record['runId']} (slot {record.get('scheduledTime')}) {verb}: {record.get('message')}",
                )  # fmt: skip
        return written


#: Outcomes a person wants to hear of: the Event's reason, and how its message says it.
RUN_EVENTS = {"Missed": ("RunMissed", "was missed"), "Failed": ("RunFailed", "failed")}


def recorded(*, before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The history records `after` holds that `before` did not (a run is recorded once; trimming only removes)."""
    known = {record.get("runId") for record in before.get("history") or []}
    return [record for record in after.get("history") or [] if record.get("runId") not in known]

