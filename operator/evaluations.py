"""The operator runs Evaluations: each spec generation once, and again on `rockbot.dev/run-requested: <new value>`.

The cases go through the shared runner (`rockbot.evaluations.running`, as `rockbot eval run` does) to the
Agent's inbox over the operator's own bus login (`service.operator`, the only sender besides rockbot local an
agent takes `evaluation` requests from); the answers come back on the operator's runs queue, where the
scheduler hands over those whose request id is an evaluation's (`take_reply`), from the Agent asked only.
A judge's key is read from the Secret its `apiKeySecretRef` names, in the Evaluation's namespace, just before
the run; a missing one fails the run before any case is sent, naming the Secret. The result is the status
(cases, score, model, the Agent's generation, the trend, `Ready` and `Passed`), an Event (Normal
EvaluationPassed / Warning EvaluationFailed) and the gauges on the operator's /metrics. What was run is kept
in status (`observedGeneration`, `runRequested`), so a restart runs nothing again. `spec.schedule` and a new
Agent generation do not start a run yet.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from rockbot.bus import Bus, Principal
from rockbot.bus.topology import OPERATOR_RUNS, agent_inbox
from rockbot.conditions import ConditionUpdate, merge_condition_models
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.evaluations.judging import Judge
from rockbot.evaluations.running import Send, run_evaluation
from rockbot.kube import AGENTS, EVALUATIONS, SECRETS, KubeClient, NotFound
from rockbot.kube.events import EventPoster
from rockbot.kube.mirroring import mirror
from rockbot.operator.builders import MANAGED_BY
from rockbot.resources import GROUP
from rockbot.resources.agent import ModelSpec
from rockbot.resources.evaluation import Evaluation, EvaluationStatus
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)
#: Set to any new value to run an Evaluation again with its spec unchanged.
RUN_REQUESTED = f"{GROUP}/run-requested"
#: How the shared runner names its requests (`run_case`): replies to these are the Evaluations'.
REQUEST_PREFIX = "eval-"
Key = tuple[str, str]


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
    """Watches Evaluations in `namespaces` (all when empty) and runs the due ones, one run per Evaluation at once."""

    def __init__(self, *, kube: KubeClient, bus: Bus, namespaces: list[str] | None = None,
                 registry: CollectorRegistry | None = None) -> None:  # fmt: skip
        self._kube = kube
        self._bus = bus
        self._namespaces: list[str | None] = list(namespaces or []) or [None]
        self.metrics = EvaluationMetrics(registry or CollectorRegistry())
        self._post_event = EventPoster(kube, component=MANAGED_BY)
        self._bodies: dict[Key, dict[str, Any]] = {}
        #: (generation, run-requested) last run per Evaluation, until its status shows it.
        self._ran: dict[Key, tuple[Any, str]] = {}
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._pending: dict[str, tuple[asyncio.Future[InboxReply], Principal]] = {}
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for namespace in self._namespaces:
            watching = mirror(kube=self._kube, resource=EVALUATIONS, namespace=namespace, on_upsert=self._seen,
                              on_delete=self._deleted)  # fmt: skip
            self._watchers.append(asyncio.create_task(watching, name=f"watch evaluations in {namespace or 'all'}"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._watchers, *self._running.values())
        self._watchers.clear()
        self._running.clear()

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

    # ---- the watch's callbacks (no API calls: they start runs)

    def _seen(self, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self._bodies[key] = body
        if key not in self._running and self._due(key, body):
            self._running[key] = asyncio.create_task(self._run_then_again(key), name=f"evaluation {key}")

    def _deleted(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self._bodies.pop(key, None)
        self._ran.pop(key, None)
        running = self._running.pop(key, None)
        if running is not None:
            running.cancel()
        self.metrics.forget(namespace, name)

    def _due(self, key: Key, body: dict[str, Any]) -> bool:
        status = body.get("status") or {}
        wanted = (body["metadata"].get("generation"), _requested(body))
        done = (status.get("observedGeneration"), status.get("runRequested", ""))
        return wanted != done and wanted != self._ran.get(key)

    async def _run_then_again(self, key: Key) -> None:
        """Run; then again while what the watch shows is due (a spec changed during the run)."""
        try:
            while (body := self._bodies.get(key)) is not None and self._due(key, body):
                self._ran[key] = (body["metadata"].get("generation"), _requested(body))
                try:
                    await self._run(body)
                except Exception:  # the next change runs it again; the operator goes on
                    log.exception("evaluation %s/%s failed to run", *key)
        finally:
            if self._running.get(key) is asyncio.current_task():
                del self._running[key]

    # ---- a run

    async def _run(self, body: dict[str, Any]) -> None:
        evaluation = Evaluation.model_validate(body)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        previous = evaluation.status or EvaluationStatus()
        generation = body["metadata"].get("generation")
        try:
            agent = await self._agent(namespace, evaluation.spec.agent_ref.name)
            keys = await self._judge_keys(namespace, evaluation)
        except Refusal as refusal:
            status = previous.model_copy(
                update={
                    "observed_generation": generation,
                    "run_requested": _requested(body),
                    "conditions": _conditions(
                        previous, generation, ready=("False", refusal.reason, str(refusal)), passed=None
                    ),
                }
            )
            await self._write(body, status)
            await self._post_event(body, "Warning", refusal.reason, str(refusal))
            return
        model = str(agent["spec"].get("model", {}).get("name", ""))
        log.info(
            "running evaluation %s/%s: %d case(s) x %d against %s",
            namespace,
            name,
            len(evaluation.spec.cases),
            evaluation.spec.repeat,
            evaluation.spec.agent_ref.name,
        )
        result = await run_evaluation(evaluation, send=self._sender(namespace, evaluation.spec.agent_ref.name),
                                      judges=lambda spec: _judge(spec, keys))  # fmt: skip
        status = result.status(previous=previous, generation=generation, model=model,
                               agent_generation=agent["metadata"].get("generation"))  # fmt: skip
        ran = sum(case.runs for case in status.cases)
        passed = sum(case.passed for case in status.cases)
        summary = (f"score {result.score:.2f} ({passed} of {ran} case runs passed), passRatio "
                   f"{evaluation.spec.pass_ratio:g}, against {model}")  # fmt: skip
        status.run_requested = _requested(body)
        status.conditions = _conditions(previous, generation, ready=("True", "Evaluated", f"ran: {summary}"),
                                        passed=result.passed, summary=summary)  # fmt: skip
        await self._write(body, status)
        self.metrics.score.labels(namespace, name).set(result.score)
        self.metrics.pass_ratio.labels(namespace, name).set(evaluation.spec.pass_ratio)
        if result.passed:
            await self._post_event(body, "Normal", "EvaluationPassed", summary)
        else:
            failing = [case.name for case in status.cases if case.result != "Passed"]
            await self._post_event(body, "Warning", "EvaluationFailed", f"{summary}; not passed: {', '.join(failing)}")

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

    async def _write(self, body: dict[str, Any], status: EvaluationStatus) -> None:
        metadata = body["metadata"]
        await self._kube.patch(EVALUATIONS, namespace=metadata["namespace"], name=metadata["name"],
                               subresource="status", body={"status": status.to_wire()})  # fmt: skip


def _requested(body: dict[str, Any]) -> str:
    return str((body["metadata"].get("annotations") or {}).get(RUN_REQUESTED, ""))


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
