"""Run an Evaluation's cases through the agent's inbox and score them: one runner, locally and in a cluster.

Each case run is an `evaluation` request on the agent's inbox (its real path: its model, its tools, its
sandbox, its recorded run of source `evaluation`), in a session of its own, starting from the case's
prior turns and answering approval-gated tools as the case says. At most `spec.concurrency` run at once.
What is sent and how the reply comes back is the caller's (`Send`): the bus in both places.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rockbot.contracts.inbox import InboxReply, InboxRequest, PriorTurn
from rockbot.evaluations.checking import Observation, Verdict, pass_ratio, verdict
from rockbot.evaluations.judging import Judge, JudgeError
from rockbot.resources.agent import ModelSpec
from rockbot.resources.evaluation import (
    TREND_LENGTH,
    CaseStatus,
    Evaluation,
    EvaluationCase,
    EvaluationRun,
    EvaluationStatus,
)

#: Sends one request to the agent's inbox and returns its reply, within `timeout_seconds` (TimeoutError after).
Send = Callable[[InboxRequest, float], Awaitable[InboxReply]]
#: The judge of a judge model spec (its key read from wherever the caller keeps Secrets).
Judges = Callable[[ModelSpec], Judge]
#: Told of each case run as it ends (the terminal prints a line).
OnVerdict = Callable[[EvaluationCase, int, Verdict], None]


@dataclass
class CaseOutcome:
    case: EvaluationCase
    verdicts: list[Verdict] = field(default_factory=list)

    def status(self) -> CaseStatus:
        """Passed when every run passed; Error when any run gave nothing to check and none failed."""
        results = {v.result for v in self.verdicts}
        result = "Failed" if "Failed" in results else "Error" if "Error" in results else "Passed"
        failing = next((v for v in reversed(self.verdicts) if v.result != "Passed"), None)
        scores = [v.score for v in self.verdicts if v.score is not None]
        return CaseStatus(
            name=self.case.name, result=result, passed=sum(v.result == "Passed" for v in self.verdicts),
            runs=len(self.verdicts), message=(failing.message if failing else "")[:2048],
            score=min(scores) if scores else None,
            agent_runs=[v.agent_run for v in self.verdicts if v.agent_run],
        )  # fmt: skip


@dataclass
class EvaluationResult:
    cases: list[CaseOutcome]
    threshold: float
    start_time: datetime.datetime
    completion_time: datetime.datetime

    @property
    def score(self) -> float:
        return round(pass_ratio([v for case in self.cases for v in case.verdicts]), 4)

    @property
    def passed(self) -> bool:
        return self.score >= self.threshold

    def status(self, *, previous: EvaluationStatus | None, generation: int | None, agent_generation: int | None,
               model: str) -> EvaluationStatus:
        """The Evaluation's status after this run: its cases, its score, and the trend with this run last."""
        run = EvaluationRun(start_time=self.start_time, completion_time=self.completion_time, score=self.score,
                            passed=self.passed, agent_generation=agent_generation, model=model)  # fmt: skip
        trend = [*(previous.trend if previous else []), run][-TREND_LENGTH:]
        return EvaluationStatus(
            observed_generation=generation, score=self.score, agent_generation=agent_generation, model=model,
            cases=[case.status() for case in self.cases], trend=trend, last_run_time=self.completion_time,
            conditions=previous.conditions if previous else [],
        )  # fmt: skip


async def run_evaluation(evaluation: Evaluation, *, send: Send, judges: Judges,
                         on_verdict: OnVerdict | None = None) -> EvaluationResult:
    """Every case, `spec.repeat` times, at most `spec.concurrency` at once; a case's failure is a verdict, never
    an exception."""
    spec = evaluation.spec
    name = evaluation.metadata.get("name", "evaluation")
    gate = asyncio.Semaphore(spec.concurrency)
    outcomes = [CaseOutcome(case=case) for case in spec.cases]
    started = _now()

    async def one(outcome: CaseOutcome, attempt: int) -> None:
        async with gate:
            result = await run_case(outcome.case, evaluation=name, attempt=attempt, send=send,
                                    timeout_seconds=spec.case_timeout_seconds,
                                    judge=_judge_of(outcome.case, evaluation=evaluation, judges=judges))  # fmt: skip
        outcome.verdicts.append(result)
        if on_verdict is not None:
            on_verdict(outcome.case, attempt, result)

    await asyncio.gather(*(one(outcome, attempt) for outcome in outcomes for attempt in range(1, spec.repeat + 1)))
    return EvaluationResult(cases=outcomes, threshold=spec.pass_ratio, start_time=started, completion_time=_now())


async def run_case(case: EvaluationCase, *, evaluation: str, attempt: int, send: Send, timeout_seconds: float,
                   judge: Judge | None) -> Verdict:
    """One run of one case: its turn through the inbox, its checks, and the judge's grade for a rubric."""
    suffix = uuid.uuid4().hex[:12]
    request = InboxRequest(
        kind="evaluation", request_id=f"eval-{evaluation}-{case.name}-{attempt}-{suffix}"[:256],
        session_id=f"eval-{evaluation}-{case.name}-{suffix}"[:256], content=case.input,
        prior_turns=tuple(PriorTurn(role=turn.role, content=turn.content) for turn in case.prior_turns),
        approvals={answer.tool: answer.decision == "Approve" for answer in case.approvals},
    )  # fmt: skip
    began = time.monotonic()
    try:
        reply = await send(request, timeout_seconds)
    except TimeoutError:
        observation = Observation(answer=None, error=f"no answer within caseTimeoutSeconds ({timeout_seconds:g} s)")
    except Exception as exc:  # the bus refused or failed: this run has nothing to check
        observation = Observation(answer=None, error=f"could not ask the agent: {type(exc).__name__}: {exc}")
    else:
        observation = _observed(reply, latency=time.monotonic() - began)
    rubric = case.expect.rubric
    if observation.error is not None or rubric is None or judge is None:
        return verdict(case.expect, observation)
    try:
        grade = await judge.grade(criteria=rubric.criteria, input=case.input, answer=observation.answer or "")
    except JudgeError as exc:
        return verdict(case.expect, observation, judge_error=str(exc))
    return verdict(case.expect, observation, score=grade.score)


def _observed(reply: InboxReply, *, latency: float) -> Observation:
    if reply.error is not None:
        return Observation(answer=None, error=f"the agent answered {reply.error.code}: {reply.error.message}",
                           agent_run=reply.run_id or "")  # fmt: skip
    return Observation(answer=reply.answer, tool_calls=list(reply.tools_called),
                       tokens=reply.prompt_tokens + reply.completion_tokens, latency_seconds=latency,
                       agent_run=reply.run_id or "")  # fmt: skip


def _judge_of(case: EvaluationCase, *, evaluation: Evaluation, judges: Judges) -> Judge | None:
    rubric = case.expect.rubric
    if rubric is None:
        return None
    spec = rubric.judge or evaluation.spec.judge
    assert spec is not None  # the spec's rule: a rubric names a judge, or spec.judge does
    return judges(spec)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
