"""Tool checks that the CRD schema cannot express."""

from __future__ import annotations

from rockbot.operator.validation import tool_problems
from tests.operator.samples import tool_body


def test_a_plain_script_tool_is_accepted():
    assert tool_problems(tool_body("ok")) == []


def test_parameters_must_be_a_valid_json_schema():
    problems = tool_problems(tool_body("t", parameters={"type": "object", "properties": {"x": {"type": "nope"}}}))
    assert len(problems) == 1
    assert problems[0].startswith("spec.parameters is not a valid JSON Schema at properties/x/type:")


def test_parameters_must_describe_an_object():
    assert tool_problems(tool_body("t", parameters={"type": "string"}))[0].startswith(
        "spec.parameters must be an object schema"
    )


def test_url_placeholders_must_be_declared_parameters():
    tool = tool_body(
        "t",
        rest={"url": "https://x.example/{city}/{day}"},
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    assert tool_problems(tool) == [
        "spec.rest.url uses {day} but spec.parameters.properties has no 'day': declare it or remove it from the URL"
    ]


def test_function_name_must_follow_the_openai_rule():
    assert "set spec.functionName" in tool_problems(tool_body("dotted.name"))[0]
    assert tool_problems(tool_body("dotted.name", functionName="dotted_name")) == []


def test_pip_packages_must_be_pep508():
    problems = tool_problems(tool_body("t", script={"source": "pass", "pipPackages": ["numpy>=1", "not a pkg!"]}))
    assert len(problems) == 1 and problems[0].startswith("spec.script.pipPackages: 'not a pkg!' is not a PEP 508")


def test_two_backends_are_refused_by_the_model_as_by_the_crd():
    problems = tool_problems(tool_body("t", script={"source": "pass"}, rest={"url": "https://x.example"}))
    assert problems == ["spec: a Tool has exactly one backend: set one of rest, mcp, script, agent or a2a"]
