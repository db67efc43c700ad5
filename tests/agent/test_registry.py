"""The registry's rules: unique names, listing and export, validation, and every failure as data."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from rockbot.agent.defining import tool
from rockbot.agent.registry import (
    InvalidToolDefinition,
    Tool,
    ToolAlreadyExists,
    ToolContext,
    ToolFailure,
    ToolOutcome,
    ToolRegistry,
)
from rockbot.contracts.errors import ErrorCode

CONTEXT = ToolContext(session_id="s1", tool_call_id="call-1")
ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


async def echo(args, context):
    return f"echo: {args['text']}"


def echo_registry(**kwargs) -> ToolRegistry:
    registry = ToolRegistry(**kwargs)
    registry.add(name="echo", description="Repeat the text.", parameters=ECHO_SCHEMA, executor=echo)
    return registry


def test_duplicate_name_is_refused_with_a_suggestion():
    registry = echo_registry()
    with pytest.raises(ToolAlreadyExists, match=r"tool 'echo' already exists.*different name, e\.g\. 'weather_echo'"):
        registry.add(name="echo", description="x", parameters=ECHO_SCHEMA, executor=echo, source="mcp:weather")
    assert len(registry) == 1


def test_get_list_and_unregister():
    registry = echo_registry()
    assert registry.get("echo").description == "Repeat the text."
    assert registry.get("nope") is None
    [info] = registry.list()
    assert (info.name, info.description, info.parameters, info.source) == ("echo", "Repeat the text.", ECHO_SCHEMA,
                                                                           "builtin")
    registry.unregister("echo")
    assert registry.list() == [] and "echo" not in registry
    with pytest.raises(KeyError, match="'echo' is not registered"):
        registry.unregister("echo")


def test_openai_export_has_the_function_format_and_leaves_out_blacklisted_tools():
    registry = echo_registry(blacklist=["secret"])
    registry.add(name="secret", description="Hidden.", parameters={"type": "object"}, executor=echo)
    assert registry.openai_tools() == [
        {"type": "function", "function": {"name": "echo", "description": "Repeat the text.", "parameters": ECHO_SCHEMA}}
    ]


def test_export_follows_registration_changes():
    registry = echo_registry()
    assert len(registry.openai_tools()) == 1
    registry.add(name="other", description="Other.", parameters={"type": "object"}, executor=echo)
    assert [t["function"]["name"] for t in registry.openai_tools()] == ["echo", "other"]
    registry.unregister("echo")
    assert [t["function"]["name"] for t in registry.openai_tools()] == ["other"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name!"}, "is not allowed"),
        ({"parameters": {"type": "string"}}, "type is 'object'"),
        ({"parameters": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, "not a valid JSON Schema"),
        ({"timeout": 0}, "timeout must be positive"),
    ],
)
def test_unusable_definitions_are_refused_at_registration(kwargs, message):
    definition = {"name": "t", "description": "d", "parameters": ECHO_SCHEMA, "executor": echo, **kwargs}
    with pytest.raises(InvalidToolDefinition, match=message):
        ToolRegistry().add(**definition)


async def test_a_valid_call_returns_the_result():
    outcome = await echo_registry().invoke("echo", '{"text": "hi"}', context=CONTEXT)
    assert outcome == ToolOutcome(tool_call_id="call-1", name="echo", content="echo: hi", arguments='{"text": "hi"}',
                                  source="builtin", duration_seconds=outcome.duration_seconds)
    assert outcome.ok and outcome.for_model() == "echo: hi"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"text": ', "arguments are not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "'text' is a required property"),
        ('{"text": 5}', "text: 5 is not of type 'string'"),
    ],
)
async def test_bad_arguments_are_invalid_arguments_and_the_tool_does_not_run(arguments, message):
    ran = []

    async def spy(args, context):
        ran.append(args)

    registry = ToolRegistry()
    registry.add(name="echo", description="d", parameters=ECHO_SCHEMA, executor=spy)
    outcome = await registry.invoke("echo", arguments, context=CONTEXT)
    assert outcome.error.code == ErrorCode.INVALID_ARGUMENTS and not outcome.error.retryable
    assert message in outcome.error.message
    assert ran == []


async def test_unknown_tool_is_tool_not_found_with_a_close_match():
    outcome = await echo_registry().invoke("ecko", "{}", context=CONTEXT)
    assert outcome.error.code == ErrorCode.TOOL_NOT_FOUND
    assert "did you mean 'echo'" in outcome.error.message
    assert json.loads(outcome.for_model())["error"]["code"] == "ToolNotFound"


async def test_blacklisted_tool_is_answered_without_running():
    ran = []

    async def spy(args, context):
        ran.append(args)

    registry = ToolRegistry(blacklist=["danger"])
    registry.add(name="danger", description="d", parameters={"type": "object"}, executor=spy)
    outcome = await registry.invoke("danger", "{}", context=CONTEXT)
    assert outcome.error.code == ErrorCode.BLACKLISTED and ran == []


async def test_a_crashing_tool_is_execution_failed():
    async def broken(args, context):
        raise RuntimeError("disk on fire")

    registry = ToolRegistry()
    registry.add(name="broken", description="d", parameters={"type": "object"}, executor=broken)
    outcome = await registry.invoke("broken", "", context=CONTEXT)
    assert outcome.error.code == ErrorCode.EXECUTION_FAILED
    assert "RuntimeError: disk on fire" in outcome.error.message and not outcome.error.retryable


async def test_a_tool_can_choose_its_error_code():
    async def down(args, context):
        raise ToolFailure("backend down", code=ErrorCode.UNAVAILABLE, retryable=True)

    registry = ToolRegistry()
    registry.add(name="down", description="d", parameters={"type": "object"}, executor=down)
    outcome = await registry.invoke("down", "{}", context=CONTEXT)
    assert (outcome.error.code, outcome.error.retryable) == (ErrorCode.UNAVAILABLE, True)


async def test_a_slow_tool_times_out_and_is_retryable():
    cancelled = asyncio.Event()

    async def slow(args, context):
        try:
            await asyncio.sleep(10)
        finally:
            cancelled.set()

    registry = ToolRegistry()
    registry.add(name="slow", description="d", parameters={"type": "object"}, executor=slow, timeout=0.05)
    outcome = await registry.invoke("slow", "{}", context=CONTEXT)
    assert (outcome.error.code, outcome.error.retryable) == (ErrorCode.TIMEOUT, True)
    assert "within 0.05 s" in outcome.error.message and cancelled.is_set()


def test_default_timeout_is_thirty_seconds():
    assert echo_registry().get("echo").timeout == 30.0


async def test_observers_see_every_outcome():
    seen = []
    registry = echo_registry(observers=[seen.append])
    await registry.invoke("echo", '{"text": "a"}', context=CONTEXT)
    await registry.invoke("nope", "{}", context=CONTEXT)
    assert [(o.name, o.status) for o in seen] == [("echo", "ok"), ("nope", "ToolNotFound")]


async def test_subset_shares_tools_and_refuses_unknown_names():
    registry = echo_registry()
    child = registry.subset(["echo"])
    assert (await child.invoke("echo", '{"text": "x"}', context=CONTEXT)).content == "echo: x"
    with pytest.raises(KeyError, match="'nope' is not registered"):
        registry.subset(["nope"])


class Point(BaseModel):
    x: int
    y: int


async def test_decorator_derives_the_schema_from_type_hints():
    @tool
    async def move(point: Point, by: Annotated[int, Field(description="how far")] = 1, *, context: ToolContext) -> str:
        """Move a point to the right.

        Longer text that is not part of the description.
        """
        return f"{point.x + by},{point.y} in {context.session_id}"

    assert move.name == "move" and move.description == "Move a point to the right."
    assert move.parameters["properties"]["by"] == {"default": 1, "description": "how far", "type": "integer"}
    assert move.parameters["required"] == ["point"]
    assert "context" not in move.parameters["properties"]
    assert "title" not in json.dumps(move.parameters)
    registry = ToolRegistry()
    registry.register(move)
    outcome = await registry.invoke("move", {"point": {"x": 1, "y": 2}, "by": 3}, context=CONTEXT)
    assert outcome.content == "4,2 in s1"
    bad = await registry.invoke("move", {"point": {"x": "one", "y": 2}}, context=CONTEXT)
    assert bad.error.code == ErrorCode.INVALID_ARGUMENTS and "point/x" in bad.error.message


async def test_decorator_runs_sync_functions_and_takes_options():
    @tool(name="add_numbers", timeout=5)
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    registry = ToolRegistry()
    registry.register(add)
    assert add.timeout == 5
    assert (await registry.invoke("add_numbers", '{"a": 2, "b": 3}', context=CONTEXT)).content == "5"


def test_decorator_needs_hints_and_a_description():
    def no_hint(a):
        """Doc."""

    def no_doc(a: int):
        pass

    with pytest.raises(TypeError, match="needs a type hint"):
        tool(no_hint)
    with pytest.raises(TypeError, match="give the tool a description"):
        tool(no_doc)


def test_tool_is_plain_data():
    t = Tool(name="x", description="d", parameters={"type": "object"}, executor=echo)
    assert t.openai()["function"]["name"] == "x"
