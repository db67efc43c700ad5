"""The Evaluation resource: cases an Agent must pass, run through its real inbox, scored, and kept in status.

A case is an input (and, optionally, the turns before it), what a good answer satisfies (text checks,
a JSON Schema, the tools called, tokens and latency bounds, a rubric a judge model grades) and how the
case answers approval-gated tools (never a person: an evaluation runs unattended). The checks are
`rockbot.evaluations.checking`; an Evaluation passes when the share of passing case runs reaches
`passRatio`.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from rockbot.resources.agent import ModelSpec
from rockbot.resources.common import (
    Condition,
    FunctionName,
    KubeName,
    ListSet,
    LocalObjectReference,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
)
from rockbot.resources.scheduledtask import CRON

#: The most cases one Evaluation lists (a status entry each), and the runs its trend keeps.
MAX_CASES = 200
TREND_LENGTH = 10

Text = Annotated[str, Field(min_length=1, max_length=10_000)]


class PriorTurn(Schema):
    """A turn of the conversation before the case's input, as the agent's history holds it."""

    role: Literal["user", "assistant"] = Field(description="Who said it: user or assistant.")
    content: Annotated[str, Field(min_length=1, max_length=100_000)] = Field(description="What was said.")


class ApprovalAnswer(Schema):
    """How the case answers a call of an approval-gated tool (a call of one it does not list is denied)."""

    tool: FunctionName = Field(description="The approval-gated tool, by the name the model calls.")
    decision: Literal["Approve", "Deny"] = Field(description="Approve (the call runs) or Deny (it does not).")


class Rubric(Schema):
    """A model-graded check: the judge reads the input, the answer and `criteria`, and gives a score in [0, 1]."""

    criteria: Annotated[str, Field(min_length=1, max_length=10_000)] = Field(
        description="What a good answer does, in words the judge model grades against."
    )
    threshold: Annotated[float, Field(ge=0, le=1)] = Field(default=0.7, description="The lowest score that passes.")
    judge: ModelSpec | None = Field(default=None, description="The judge model; defaults to spec.judge.")


class Expectations(Schema):
    """What a good answer satisfies: every check given must hold."""

    rules = (
        Rule(
            cel="!has(self.mustCall) || !has(self.mustNotCall) || "
            "self.mustCall.all(t, !(t in self.mustNotCall))",
            message="mustCall and mustNotCall name the same tool: a case cannot pass both",
            holds=lambda e: not set(e.must_call) & set(e.must_not_call),
        ),
    )

    contains: Annotated[list[Text], Field(max_length=64)] = Field(
        default_factory=list, description="Texts the answer contains (case-sensitive)."
    )
    not_contains: Annotated[list[Text], Field(max_length=64)] = Field(
        default_factory=list, description="Texts the answer does not contain (case-sensitive)."
    )
    regex: Annotated[str, Field(min_length=1, max_length=2000)] | None = Field(
        default=None, description="A regular expression the answer matches somewhere (Python's re.search)."
    )
    json_schema: dict[str, Any] | None = Field(
        default=None, description="A JSON Schema the answer, parsed as JSON, is valid against."
    )
    must_call: Annotated[list[FunctionName], Field(max_length=64), ListSet()] = Field(
        default_factory=list, description="Tools the agent calls at least once."
    )
    must_not_call: Annotated[list[FunctionName], Field(max_length=64), ListSet()] = Field(
        default_factory=list, description="Tools the agent never calls."
    )
    max_tool_calls: Annotated[int, Field(ge=0, le=1000)] | None = Field(
        default=None, description="The most tool calls the turn makes."
    )
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="The most tokens (prompt and completion, all model requests) the turn uses."
    )
    max_latency_seconds: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        default=None, description="The longest the turn takes, from sending the input to the answer."
    )
    rubric: Rubric | None = None


class EvaluationCase(Schema):
    name: KubeName = Field(description="The case's name, unique in the Evaluation.")
    input: Annotated[str, Field(min_length=1, max_length=100_000)] = Field(description="The user turn sent.")
    prior_turns: Annotated[list[PriorTurn], Field(max_length=100)] = Field(
        default_factory=list, description="The conversation before the input, oldest first."
    )
    approvals: Annotated[list[ApprovalAnswer], Field(max_length=64)] = Field(
        default_factory=list, description="Answers to approval-gated tools; any other gated call is denied."
    )
    expect: Expectations = Field(default_factory=Expectations)


class EvaluationSpec(Schema):
    rules = (
        Rule(
            cel="self.cases.all(c, self.cases.exists_one(d, d.name == c.name))",
            message="cases: each case has its own name",
            holds=lambda s: len({c.name for c in s.cases}) == len(s.cases),
        ),
        Rule(
            cel="has(self.judge) || self.cases.all(c, !has(c.expect.rubric) || has(c.expect.rubric.judge))",
            message="judge: a case has a rubric but neither it nor spec.judge names a judge model",
            holds=lambda s: s.judge is not None or all(
                c.expect.rubric is None or c.expect.rubric.judge is not None for c in s.cases
            ),
        ),
    )

    agent_ref: LocalObjectReference = Field(description="The Agent under test, in this namespace.")
    cases: Annotated[list[EvaluationCase], Field(min_length=1, max_length=MAX_CASES)] = Field(
        description="What the Agent is asked and what a good answer satisfies."
    )
    repeat: Annotated[int, Field(ge=1, le=20)] = Field(default=1, description="Runs of each case.")
    pass_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        default=1.0, description="The share of case runs that must pass for the Evaluation to pass."
    )
    judge: ModelSpec | None = Field(default=None, description="The judge model of rubric cases that name none.")
    schedule: Annotated[str, Field(pattern=CRON, max_length=256)] | None = Field(
        default=None, description="Cron: 5 fields (minute), 6 fields (second first), or @hourly-style macros."
    )
    time_zone: Annotated[str, Field(pattern=r"^[A-Za-z0-9_+\-/]{1,64}$")] = Field(
        default="UTC", description="IANA time zone of the schedule, e.g. Europe/Berlin."
    )
    concurrency: Annotated[int, Field(ge=1, le=16)] = Field(default=4, description="Case runs at once.")
    case_timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=300, description="The longest one case run waits for the agent's answer."
    )


CaseResult = Literal["Passed", "Failed", "Error"]


class CaseStatus(Schema):
    name: str
    result: CaseResult
    passed: int = Field(default=0, description="Runs of the case that passed (of spec.repeat).")
    runs: int = 0
    message: Annotated[str, Field(max_length=2048)] = Field(default="", description="Why the last failing run failed.")
    score: float | None = Field(default=None, description="The judge's lowest score, for rubric cases.")
    agent_runs: list[str] = Field(default_factory=list, description="The agent's recorded turns: rockbot runs show.")


#: Why a run started: a new spec generation, a new rockbot.dev/run-requested value, a slot of spec.schedule, or a
#: new generation of the Agent under test.
RunReason = Literal["Spec", "Requested", "Schedule", "AgentChanged"]


class ActiveEvaluationRun(Schema):
    """The run under way, recorded before its first case is sent: an operator that takes over finds it here and runs
    it again (the cases of the one that stopped are not waited for), so no run is lost or counted twice."""

    run_id: str = Field(description="The run's id; its trend entry keeps it.")
    reason: RunReason = Field(description="Why it runs: Spec, Requested, Schedule or AgentChanged.")
    start_time: datetime.datetime
    scheduled_time: datetime.datetime | None = Field(default=None, description="The slot of spec.schedule it runs.")
    attempt: int = Field(default=1, description="2 and more: run again after the operator running it stopped.")


class EvaluationRun(Schema):
    """One run of the whole Evaluation, as its trend keeps it."""

    run_id: str | None = Field(default=None, description="The operator's id of the run (status.active.runId).")
    reason: RunReason | None = None
    attempts: int | None = Field(default=None, description="More than 1: run again after the operator running it "
                                 "stopped.")  # fmt: skip
    start_time: datetime.datetime
    completion_time: datetime.datetime | None = None
    score: float = Field(description="The share of case runs that passed.")
    passed: bool
    agent_generation: int | None = None
    model: str = ""


class EvaluationStatus(Schema):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    score: float | None = None
    agent_generation: int | None = None
    model: str = ""
    cases: list[CaseStatus] = Field(default_factory=list)
    trend: list[EvaluationRun] = Field(default_factory=list, description="The last runs, oldest first.")
    last_run_time: datetime.datetime | None = None
    run_requested: str = Field(default="", description="The rockbot.dev/run-requested annotation's value last run.")
    next_run_time: datetime.datetime | None = Field(default=None, description="The next slot of spec.schedule.")
    active: ActiveEvaluationRun | None = Field(default=None, description="The run under way, if any.")


class Evaluation(Resource):
    """Cases an Agent must pass, run through its inbox, tools and sandbox."""

    kind: ClassVar[str] = "Evaluation"
    plural: ClassVar[str] = "evaluations"
    short_names: ClassVar[list[str]] = ["ev"]
    printer_columns: ClassVar[list[PrinterColumn]] = [
        PrinterColumn(name="Agent", type="string", json_path=".spec.agentRef.name"),
        PrinterColumn(name="Passed", type="string", json_path='.status.conditions[?(@.type=="Passed")].status'),
        PrinterColumn(name="Score", type="number", json_path=".status.score"),
        PrinterColumn(name="Model", type="string", json_path=".status.model"),
        PrinterColumn(name="Last", type="date", json_path=".status.lastRunTime"),
        PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),
    ]

    api_version: str = "rockbot.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: EvaluationSpec
    status: EvaluationStatus | None = None


__all__ = ["Evaluation", "EvaluationCase", "EvaluationSpec", "EvaluationStatus", "Expectations"]
