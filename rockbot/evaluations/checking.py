"""A case's checks over what one run of it did: each failed check is one sentence saying what was expected.

The checks are pure (no model, no bus): the runner observes a turn (its answer, the tools it called in
order, the tokens it used, how long it took) and hands it here. The rubric is the one check that needs
a model; `judging` grades it and `verdict` folds its score in.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

import jsonschema

from rockbot.resources.evaluation import CaseResult, Expectations

#: How much of an answer a failure message quotes.
QUOTE_CHARS = 200


@dataclass(frozen=True)
class Observation:
    """What one run of a case did. `error`: the turn did not answer (timed out, refused, the model failed)."""

    answer: str | None
    tool_calls: list[str] = field(default_factory=list)
    tokens: int | None = None
    latency_seconds: float = 0.0
    error: str | None = None
    agent_run: str = ""


@dataclass(frozen=True)
class Verdict:
    result: CaseResult
    failures: list[str] = field(default_factory=list)
    score: float | None = None
    agent_run: str = ""

    @property
    def message(self) -> str:
        return "; ".join(self.failures)


def check(expect: Expectations, observation: Observation) -> list[str]:
    """Every check of `expect` (but the rubric) that `observation` fails, as sentences; empty: all hold."""
    answer = observation.answer or ""
    failures = [f"the answer does not contain {text!r}" for text in expect.contains if text not in answer]
    failures += [f"the answer contains {text!r}" for text in expect.not_contains if text in answer]
    if expect.regex is not None and re.search(expect.regex, answer) is None:
        failures.append(f"the answer does not match /{expect.regex}/: {_quote(answer)}")
    if expect.json_schema is not None:
        failures += _schema_failures(expect.json_schema, answer)
    called = Counter(observation.tool_calls)
    failures += [f"{tool} was not called (called: {_names(called)})" for tool in expect.must_call if not called[tool]]
    failures += [f"{tool} was called {called[tool]} time(s)" for tool in expect.must_not_call if called[tool]]
    if expect.max_tool_calls is not None and len(observation.tool_calls) > expect.max_tool_calls:
        failures.append(f"{len(observation.tool_calls)} tool calls, more than maxToolCalls {expect.max_tool_calls}")
    if expect.max_tokens is not None:
        if observation.tokens is None:
            failures.append("maxTokens: the turn's token count is unknown (its run was not recorded)")
        elif observation.tokens > expect.max_tokens:
            failures.append(f"{observation.tokens} tokens, more than maxTokens {expect.max_tokens}")
    if expect.max_latency_seconds is not None and observation.latency_seconds > expect.max_latency_seconds:
        failures.append(f"took {observation.latency_seconds:.2f} s, longer than maxLatencySeconds "
                        f"{expect.max_latency_seconds:g}")
    return failures


def verdict(expect: Expectations, observation: Observation, *, score: float | None = None,
            judge_error: str | None = None) -> Verdict:
    """The run's result: Error when the turn (or the judge) gave no answer to check, else Passed or Failed."""
    if observation.error is not None:
        return Verdict(result="Error", failures=[observation.error], agent_run=observation.agent_run)
    if judge_error is not None:
        return Verdict(result="Error", failures=[f"the judge failed: {judge_error}"], agent_run=observation.agent_run)
    failures = check(expect, observation)
    if expect.rubric is not None and score is not None and score < expect.rubric.threshold:
        failures.append(f"the judge scored {score:.2f}, under the rubric's threshold {expect.rubric.threshold:g}")
    return Verdict(result="Failed" if failures else "Passed", failures=failures, score=score,
                   agent_run=observation.agent_run)


def pass_ratio(verdicts: list[Verdict]) -> float:
    """The share of case runs that passed (an Error counts as not passed); 0 with none."""
    return sum(v.result == "Passed" for v in verdicts) / len(verdicts) if verdicts else 0.0


def _schema_failures(schema: dict, answer: str) -> list[str]:
    try:
        document = json.loads(_unfenced(answer))
    except json.JSONDecodeError as exc:
        return [f"jsonSchema: the answer is not JSON ({exc.msg} at character {exc.pos}): {_quote(answer)}"]
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document), key=lambda e: list(e.path))
    return [f"jsonSchema: {'/'.join(map(str, e.path)) or 'the answer'}: {e.message}" for e in errors[:5]]


def _unfenced(answer: str) -> str:
    """The JSON inside a Markdown code fence, which models put around JSON whether asked to or not."""
    fenced = re.fullmatch(r"\s*```(?:json)?\s*\n(.*?)\n?```\s*", answer, flags=re.DOTALL)
    return fenced.group(1) if fenced else answer


def _names(called: Counter[str]) -> str:
    return ", ".join(sorted(called)) or "none"


def _quote(text: str) -> str:
    return repr(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…")
