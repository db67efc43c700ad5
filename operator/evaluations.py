"""The operator runs Evaluations: on a new spec generation, a new `rockbot.dev/run-requested` value, each slot of
`spec.schedule`, and a new generation of the Agent under test (`evaluation_plans` decides; one loop per Evaluation).

The cases go through the shared runner (`rockbot.evaluations.running`, as `rockbot eval run` does) to the
Agent's inbox over the operator's own bus login (`service.operator`, the only sender besides rockbot local an
agent takes `evaluation` requests from); the answers come back on the operator's runs queue, where the
scheduler hands over those whose request id is an evaluation's (`take_reply`), from the Agent asked only.
A judge's key is read from the Secret its `apiKeySecretRef` names, in the Evaluation's namespace, just before
the run; a missing one fails the run before any case is sent, naming the Secret. The result is the status
(cases, score, model, the Agent's generation, the trend, `Ready` and `Passed`), an Event (Normal
EvaluationPassed / Warning EvaluationFailed) and the gauges on the operator's /metrics.

Exactly once, as the ScheduledTasks' firing loop does it: the run is written into status (`active`) before its
first case is sent, conditionally on the resourceVersion read (only the leader runs this at all; the condition
covers the moments two replicas might both think they lead), and its end only while the status still holds that
run, so it enters the trend once. An operator that takes over (the leader SIGKILLed) finds the run active and runs
it again (Event EvaluationResumed; the trend entry's `attempts` says how often it started).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from rockbot.bus import Bus, Principal
from rockbot.bus.topology import OPERATOR_RUNS, agent_inbox
from rockbot.clock import Clock, SystemClock
from rockbot.conditions import ConditionUpdate, merge_condition_models
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.evaluations.judging import Judge
from rockbot.evaluations.running import Send, run_evaluation
from rockbot.kube import AGENTS, EVALUATIONS, SECRETS, Conflict, KubeClient, NotFound
from rockbot.kube.events import EventPoster
from rockbot.operator.builders import MANAGED_BY
from rockbot.operator.evaluation_plans import RUN_REQUESTED, Claim, plan, schedule_of, wake_at
from rockbot.operator.scheduling.cron import InvalidSchedule
from rockbot.operator.scheduling.loops import AgentFeed, Key, LoopState, Next, ObjectLoops, agent_of
from rockbot.resources.agent import ModelSpec
from rockbot.resources.evaluation import Evaluation, EvaluationStatus

log = logging.getLogger(__name__)
#: How the shared runner names its requests (`run_case`): replies to these are the Evaluations'.
REQUEST_PREFIX = "eval-"
#: How often one run starts (the first time, and again after an operator stopped before its end) before it is
#: given up: a run that crashes whoever runs it must not run forever.
MAX_ATTEMPTS = 3
__all__ = ["RUN_REQUESTED", "EvaluationRunner"]


class Refusal(Exception):
    """Why an Evaluation cannot run now: its status says so (Ready False, `reason`), with a Warning Event."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EvaluationMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["namespace", "evaluation"]
        self.score = Gauge("rockbot_evaluation_score", "The share of an Evaluation's case runs that passed, "
                           "in its last run.", labels, registry=registry)  # fmt: skip
        self.pass_ratio = Gauge(
            "rockbot_evaluation_pass_ratio",
            "The share of case runs an Evaluation must pass (spec.passRatio): it failed when the score is under it.",
            labels,
            registry=registry,
        )

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (self.score, self.pass_ratio):
            with contextlib.suppress(KeyError):  # never set: it has not run since the operator started
                gauge.remove(namespace, name)


class EvaluationRunner:
    """Watches Evaluations in `namespaces` (all when empty) and runs the due ones, one run per Evaluation at once.

    `agents`: the operator's own watch of Agents, followed instead of watching them again (else watched here)."""

    def __init__(self, *, kube: KubeClient, bus: Bus, namespaces: list[str] | None = None,
                 registry: CollectorRegistry | None = None, clock: Clock | None = None,
                 agents: AgentFeed | None = None) -> None:  # fmt: skip
        self._kube = kube
        self._bus = bus
        self._clock = clock or SystemClock()
        self.metrics = EvaluationMetrics(registry or CollectorRegistry())
        self._post_event = EventPoster(kube, component=MANAGED_BY)
        # A step is not shielded: a run cut short stays active in status. The pause after a failure is not ended by
        # a change: the failed step's own writes' echoes would make it a busy loop.
        self._loops = ObjectLoops(kube=kube, resource=EVALUATIONS, kind="evaluation", namespaces=namespaces,
                                  clock=self._clock, step=self._step, logger=log, agents=agents,
                                  on_agent=self._agent_seen, on_agent_deleted=self._agent_deleted,
                                  shielded=False, wake_in_backoff=False, forget=self.metrics.forget)  # fmt: skip
        self._agent_generations: dict[Key, int | None] = {}
        self._pending: dict[str, tuple[asyncio.Future[InboxReply], Principal]] = {}

    async def start(self) -> None:
        await self._loops.start()

    async def stop(self) -> None:
        """Stop watching and running; a run cut short stays active in status, for the next leader to run again."""
        await self._loops.stop()

    def take_reply(self, reply: InboxReply, sender: Principal | None) -> bool:
        """Whether `reply` is an Evaluation's (taken: handed to its waiting case, if `sender` is the Agent asked)."""
        if not reply.request_id.startswith(REQUEST_PREFIX):
            return False
        pending = self._pending.get(reply.request_id)
        if pending is None:
            log.info(
                "dropping the reply to %s: no case waits for it (timed out, or the operator restarted)",
                reply.request_id,
            )
        elif sender != pending[1]:
            log.warning("ignoring %s's reply to %s: the case was sent to %s", sender, reply.request_id, pending[1])
        elif not pending[0].done():
            pending[0].set_result(reply)
        return True

    # ---- the Agent watch's callbacks (no API calls: they wake loops)

    def _agent_seen(self, body: dict[str, Any]) -> None:
        metadata = body["metadata"]
        key = (metadata["namespace"], metadata["name"])
        if self._agent_generations.get(key) != metadata.get("generation"):
            self._agent_generations[key] = metadata.get("generation")
            self._loops.wake_referrers(key)

    def _agent_deleted(self, namespace: str, name: str) -> None:
        self._agent_generations.pop((namespace, name), None)

    # ---- one step of an Evaluation's loop (a step that fails may leave its run active: taken up again, at most
    # MAX_ATTEMPTS starts)

    async def _step(self, key: Key, state: LoopState) -> Next:
        """Plan; record the run; run it. Returns (plan again at once, else when to wake at the latest)."""
        body, seen = state.body, state.seen
        agent = self._agent_generations.get((key[0], agent_of(body)))
        claim = plan(body=body, agent_generation=agent, now=self._clock.now(), recovering=state.recovering)
        state.recovering = False
        if claim is None:
            return False, wake_at(body)
        if claim.run.attempt > MAX_ATTEMPTS:
            state.keep(await self._abandon(body, claim), seen=seen)
            return True, None
        try:
            claimed = await self._write(body, claim.status, conditional=True)
        except Conflict:  # another writer came first: plan again from what it wrote
            state.keep(await self._kube.get(EVALUATIONS, namespace=key[0], name=key[1]), seen=seen)
            return True, None
        state.keep(claimed, seen=seen)
        seen = state.seen
        state.keep(await self._run(claimed, claim), seen=seen)
        return True, None

    async def _abandon(self, body: dict[str, Any], claim: Claim) -> dict[str, Any]:
        """End a run that started MAX_ATTEMPTS times without ending: not run again, and said so."""
        run = claim.run
        message = (f"run {run.run_id} ({run.reason}) started {MAX_ATTEMPTS} times without ending (the operator "
                   "running it stopped, or could not record its end: see the operator's log); it is not run again, "
                   "the next spec change, slot, Agent generation or run-requested value runs it anew")  # fmt: skip
        known = await self._agent_generation(body["metadata"]["namespace"], agent_of(body))
        written = await self._end(body, run.run_id, lambda current: current.model_copy(update={
            "conditions": _conditions(current, current.observed_generation, ready=("False", "RunAbandoned", message),
                                      passed=None),
            "agent_generation": current.agent_generation if known is None else known}),
            attempt=run.attempt - 1)  # fmt: skip
        await self._post_event(body, "Warning", "EvaluationAbandoned", message)
        return written

    # ---- a run

    async def _run(self, body: dict[str, Any], claim: Claim) -> dict[str, Any]:
        """Run the claimed run and record its end; returns the object as written."""
        evaluation = Evaluation.model_validate(body)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        run = claim.run
        again = (f"; run {run.run_id} again (attempt {run.attempt}): its last attempt did not end (the operator "
                 "running it stopped, or could not record its end)" if claim.resumed else "")  # fmt: skip
        if claim.resumed:
            await self._post_event(body, "Normal", "EvaluationResumed", again.removeprefix("; "))
        agent: dict[str, Any] = {}
        try:
            agent = await self._agent(namespace, evaluation.spec.agent_ref.name)
            keys = await self._judge_keys(namespace, evaluation)
            _check_schedule(evaluation)
        except Refusal as exc:
            refusal = exc
        else:
            refusal = None
        if refusal is not None:
            # The Agent's generation is kept (when there is one): the refused run is not started again for it, and
            # an Agent that appears later starts a run (AgentChanged).
            ready = ("False", refusal.reason, str(refusal))
            written = await self._end(body, run.run_id, lambda current: current.model_copy(update={
                "conditions": _conditions(current, current.observed_generation, ready=ready, passed=None),
                "agent_generation": (agent.get("metadata") or {}).get("generation", current.agent_generation)}),
                attempt=run.attempt)  # fmt: skip
            await self._post_event(body, "Warning", refusal.reason, str(refusal))
            return written
        model = str(agent["spec"].get("model", {}).get("name", ""))
        log.info("running evaluation %s/%s (%s, %s, attempt %d): %d case(s) x %d against %s", namespace, name,
                 run.run_id, run.reason, run.attempt, len(evaluation.spec.cases), evaluation.spec.repeat,
                 evaluation.spec.agent_ref.name)  # fmt: skip
        result = await run_evaluation(evaluation, send=self._sender(namespace, evaluation.spec.agent_ref.name),
                                      judges=lambda spec: _judge(spec, keys))  # fmt: skip
        ran = sum(len(case.verdicts) for case in result.cases)
        passed = sum(v.result == "Passed" for case in result.cases for v in case.verdicts)
        summary = (f"score {result.score:.2f} ({passed} of {ran} case runs passed), passRatio "
                   f"{evaluation.spec.pass_ratio:g}, against {model}; run {run.run_id} ({run.reason}"
                   f"{f', attempt {run.attempt}' if claim.resumed else ''})")  # fmt: skip

        def ended(current: EvaluationStatus) -> EvaluationStatus:
            status = result.status(previous=current, generation=current.observed_generation, model=model,
                                   agent_generation=agent["metadata"].get("generation"))  # fmt: skip
            status.trend[-1] = status.trend[-1].model_copy(update={"run_id": run.run_id, "reason": run.reason,
                                                                   "attempts": run.attempt})  # fmt: skip
            status.run_requested, status.next_run_time = current.run_requested, current.next_run_time
            ready = ("True", "Evaluated", f"ran: {summary}")
            status.conditions = _conditions(current, current.observed_generation, passed=result.passed, ready=ready,
                                            summary=summary)  # fmt: skip
            return status

        written = await self._end(body, run.run_id, ended, attempt=run.attempt)
        self.metrics.score.labels(namespace, name).set(result.score)
        self.metrics.pass_ratio.labels(namespace, name).set(evaluation.spec.pass_ratio)
        if result.passed:
            await self._post_event(body, "Normal", "EvaluationPassed", summary)
        else:
            failing = [case.case.name for case in result.cases if case.status().result != "Passed"]
            await self._post_event(body, "Warning", "EvaluationFailed", f"{summary}; not passed: {', '.join(failing)}")
        return written

    async def _end(self, body: dict[str, Any], run_id: str, ended: Callable[[EvaluationStatus], EvaluationStatus],
                   *, attempt: int) -> dict[str, Any]:  # fmt: skip
        """Write `ended(status)` with the run no longer active, only while the status still holds `run_id` at
        `attempt` active: a run another operator took over is not counted twice."""
        metadata = body["metadata"]
        while True:
            current = await self._kube.get(EVALUATIONS, namespace=metadata["namespace"], name=metadata["name"])
            status = EvaluationStatus.model_validate(current.get("status") or {})
            if status.active is None or (status.active.run_id, status.active.attempt) != (run_id, attempt):
                log.warning("evaluation %s/%s: run %s (attempt %d) is no longer the active one (%s): its result "
                            "is dropped", *_key(body), run_id, attempt, status.active)  # fmt: skip
                return current
            try:
                return await self._write(current, ended(status).model_copy(update={"active": None}),
                                         conditional=True)  # fmt: skip
            except Conflict:
                continue

    async def _agent_generation(self, namespace: str, name: str) -> int | None:
        """The Agent's generation as the watch shows it, or as the API does when the watch has not shown it yet."""
        if (namespace, name) not in self._agent_generations:
            with contextlib.suppress(NotFound):
                self._agent_seen(await self._kube.get(AGENTS, namespace=namespace, name=name))
        return self._agent_generations.get((namespace, name))

    async def _agent(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return await self._kube.get(AGENTS, namespace=namespace, name=name)
        except NotFound:
            raise Refusal("AgentNotFound", f"spec.agentRef: no Agent {name!r} in {namespace}: apply it, or name "
                          "an existing one") from None  # fmt: skip

    async def _judge_keys(self, namespace: str, evaluation: Evaluation) -> dict[tuple[str, str], str]:
        """The API keys of every judge the cases use, by (Secret, key)."""
        judges = [evaluation.spec.judge, *(case.expect.rubric.judge for case in evaluation.spec.cases
                                           if case.expect.rubric is not None)]  # fmt: skip
        refs = {(j.api_key_secret_ref.name, j.api_key_secret_ref.key) for j in judges
                if j is not None and j.api_key_secret_ref is not None}  # fmt: skip
        keys = {}
        for secret, key in sorted(refs):
            try:
                data = (await self._kube.get(SECRETS, namespace=namespace, name=secret)).get("data") or {}
            except NotFound:
                data = {}
            if key not in data:
                raise Refusal("JudgeSecretMissing", f"a judge's apiKeySecretRef names key {key!r} of Secret "
                              f"{secret!r} in {namespace}, which does not exist: create it (kubectl create secret "
                              f"generic {secret} --from-literal={key}=...)")  # fmt: skip
            keys[(secret, key)] = base64.b64decode(data[key]).decode()
        return keys

    def _sender(self, namespace: str, agent: str) -> Send:
        """Sends a case to the Agent's inbox as the operator; its answer comes back through `take_reply`."""
        responder = Principal.agent(namespace=namespace, name=agent)

        async def send(request: InboxRequest, timeout_seconds: float) -> InboxReply:
            future: asyncio.Future[InboxReply] = asyncio.get_running_loop().create_future()
            self._pending[request.request_id] = (future, responder)
            try:
                async with asyncio.timeout(timeout_seconds):
                    await self._bus.publish(
                        queue=agent_inbox(namespace=namespace, name=agent), body=request,
                        message_id=request.request_id, correlation_id=request.request_id,
                        reply_to=OPERATOR_RUNS.name, expires_after_seconds=timeout_seconds,
                    )  # fmt: skip
                    return await future
            finally:
                self._pending.pop(request.request_id, None)

        return send

    async def _write(self, body: dict[str, Any], status: EvaluationStatus, *, conditional: bool) -> dict[str, Any]:
        """Merge-patch the status (fields it no longer has removed); `conditional`: only if the object is still at
        the version of `body` (409 `Conflict` else)."""
        metadata = body["metadata"]
        wanted = status.to_wire()
        patch: dict[str, Any] = {"status": {key: None for key in body.get("status") or {} if key not in wanted}
                                 | wanted}  # fmt: skip
        if conditional:
            patch["metadata"] = {"resourceVersion": metadata["resourceVersion"]}
        return await self._kube.patch(EVALUATIONS, namespace=metadata["namespace"], name=metadata["name"],
                                      subresource="status", body=patch)  # fmt: skip


def _key(body: dict[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def _check_schedule(evaluation: Evaluation) -> None:
    try:
        schedule_of(evaluation.spec)
    except InvalidSchedule as exc:
        raise Refusal("InvalidSchedule", f"spec.{exc.field}: {exc.message}") from None


def _judge(spec: ModelSpec, keys: dict[tuple[str, str], str]) -> Judge:
    ref = spec.api_key_secret_ref
    return Judge(base_url=spec.base_url, model=spec.name, timeout_seconds=spec.request_timeout_seconds,
                 api_key=keys.get((ref.name, ref.key)) if ref else None)  # fmt: skip


def _conditions(previous: EvaluationStatus, generation: int | None, *, ready: tuple[str, str, str],
                passed: bool | None, summary: str = "") -> list[Any]:  # fmt: skip
    """`Ready` (the last run ran, or why not) and `Passed` (its score reached passRatio; Unknown when not run)."""
    status, reason, message = ready
    verdict = (
        ConditionUpdate(type="Passed", status="Unknown", reason="NotRun", message=message)
        if passed is None
        else ConditionUpdate(
            type="Passed",
            status="True" if passed else "False",
            reason="ScoreReached" if passed else "ScoreUnderPassRatio",
            message=summary,
        )
    )
    updates = [ConditionUpdate(type="Ready", status=status, reason=reason, message=message), verdict]  # type: ignore[arg-type]
    return merge_condition_models(previous.conditions, updates, generation=generation,
                                  now=datetime.datetime.now(datetime.UTC))  # fmt: skip
