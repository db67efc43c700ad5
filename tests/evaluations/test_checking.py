"""A case's checks, each failing with a sentence that says what was expected (no model, no bus)."""

from __future__ import annotations

import pytest

from rockbot.evaluations.checking import Observation, check, pass_ratio, verdict
from rockbot.evaluations.judging import JudgeError, parse_grade
from rockbot.resources import validate
from rockbot.resources.evaluation import Expectations


def _expect(**fields) -> Expectations:
    return Expectations.model_validate(fields)


def test_an_answer_that_meets_every_check_passes():
    expect = _expect(contains=["Berlin"], notContains=["sorry"], regex=r"\d+ ?°C", mustCall=["weather"],
                     mustNotCall=["delete_all"], maxToolCalls=2, maxTokens=500, maxLatencySeconds=30)
    seen = Observation(answer="Berlin: 21 °C", tool_calls=["weather"], tokens=120, latency_seconds=1.5)
    assert check(expect, seen) == []
    assert verdict(expect, seen).result == "Passed"


def test_each_broken_check_says_what_was_expected():
    expect = _expect(contains=["Berlin"], notContains=["sorry"], regex=r"^\d", mustCall=["weather"],
                     mustNotCall=["delete_all"], maxToolCalls=1, maxTokens=100, maxLatencySeconds=2)
    seen = Observation(answer="sorry, no idea", tool_calls=["delete_all", "delete_all"], tokens=101,
                       latency_seconds=2.5)
    assert check(expect, seen) == [
        "the answer does not contain 'Berlin'",
        "the answer contains 'sorry'",
        "the answer does not match /^\\d/: 'sorry, no idea'",
        "weather was not called (called: delete_all)",
        "delete_all was called 2 time(s)",
        "2 tool calls, more than maxToolCalls 1",
        "101 tokens, more than maxTokens 100",
        "took 2.50 s, longer than maxLatencySeconds 2",
    ]
    assert verdict(expect, seen).result == "Failed"


def test_a_json_answer_is_checked_against_the_schema_even_in_a_code_fence():
    expect = _expect(jsonSchema={"type": "object", "required": ["city", "celsius"],
                                 "properties": {"celsius": {"type": "number"}}})
    assert check(expect, Observation(answer='```json\n{"city": "Berlin", "celsius": 21}\n```')) == []
    assert check(expect, Observation(answer='{"city": "Berlin", "celsius": "warm"}')) == [
        "jsonSchema: celsius: 'warm' is not of type 'number'"]
    assert check(expect, Observation(answer="21 degrees"))[0].startswith("jsonSchema: the answer is not JSON")


def test_a_turn_without_an_answer_is_an_error_not_a_failure():
    result = verdict(_expect(contains=["x"]), Observation(answer=None, error="timed out after 5 s"))
    assert (result.result, result.message) == ("Error", "timed out after 5 s")
    assert pass_ratio([result, verdict(_expect(), Observation(answer="ok"))]) == 0.5


def test_a_judge_score_under_the_threshold_fails_the_case():
    expect = _expect(rubric={"criteria": "polite", "threshold": 0.8})
    assert verdict(expect, Observation(answer="hi"), score=0.9).result == "Passed"
    low = verdict(expect, Observation(answer="hi"), score=0.5)
    assert (low.result, low.score, low.message) == ("Failed", 0.5,
                                                    "the judge scored 0.50, under the rubric's threshold 0.8")


def test_the_judge_must_reply_a_score_between_0_and_1():
    assert parse_grade('Here: {"score": 0.75, "reason": "fine"}').score == 0.75
    for reply in ("great answer", '{"score": 3}', '{"score": true}', '{"grade": 1}'):
        with pytest.raises(JudgeError, match="did not reply"):
            parse_grade(reply)


def _evaluation(**spec) -> dict:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": "e"},
            "spec": {"agentRef": {"name": "a"}, "cases": [{"name": "c", "input": "hi"}], **spec}}


def test_an_evaluation_refuses_what_it_could_never_run():
    assert validate(_evaluation()) == []
    assert validate(_evaluation(cases=[{"name": "c", "input": "a"}, {"name": "c", "input": "b"}])) == [
        "spec: cases: each case has its own name"]
    rubric = {"name": "c", "input": "a", "expect": {"rubric": {"criteria": "kind"}}}
    assert validate(_evaluation(cases=[rubric])) == [
        "spec: judge: a case has a rubric but neither it nor spec.judge names a judge model"]
    both = {"name": "c", "input": "a", "expect": {"mustCall": ["t"], "mustNotCall": ["t"]}}
    assert validate(_evaluation(cases=[both])) == [
        "spec.cases[0].expect: mustCall and mustNotCall name the same tool: a case cannot pass both"]
    assert validate(_evaluation(passRatio=1.5))[0].startswith("spec.passRatio:")
