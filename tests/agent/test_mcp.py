"""MCP tools against real MCP servers (the SDK's own server, started by the test) over all three transports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.contracts.agent_config import (
    FunctionDefinition,
    McpBackend,
    ResolvedTool,
    RestBackend,
    ToolDefinition,
)
from tests.agent.configs import agent_config

SERVER = str(Path(__file__).with_name("mcp_server.py"))
CONTEXT = ToolContext(session_id="s", tool_call_id="c")


def serve(transport: str):
    """Start the test server; it binds port 0 itself and prints the port, so there is no port to race for."""
    process = subprocess.Popen([sys.executable, SERVER, transport], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline().strip()
    if not line.isdigit():
        process.kill()
        raise RuntimeError(f"the MCP test server ({transport}) did not report its port (exit {process.wait(10)})")
    return process, int(line)


@pytest.fixture(scope="module")
def http_server():
    process, port = serve("streamable-http")
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def sse_server():
    process, port = serve("sse")
    yield f"http://127.0.0.1:{port}/sse"
    process.terminate()
    process.wait(10)


def mcp_tool(name: str, backend: dict, *, description: str = "", parameters=None) -> ResolvedTool:
    return ResolvedTool(
        definition=ToolDefinition(function=FunctionDefinition(
            name=name, description=description, parameters=parameters or {"type": "object", "properties": {}})),
        source=f"tool:{name}",
        backend=McpBackend(**backend),
    )


async def test_every_tool_of_a_streamable_http_server_is_registered_and_callable(http_server, scripted_llm, caplog):
    """`rock.density` is a fine MCP name but not an OpenAI one: skipped with a warning, the rest still work."""
    config = agent_config(llm_url=scripted_llm.url, tools=[
        mcp_tool("rocks", {"server": "rocks", "url": http_server, "tool": "*"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        listed = {t.name: t for t in agent.registry.list()}
        added = await agent.registry.invoke("add", '{"a": 2, "b": 40}', context=CONTEXT)
        failed = await agent.registry.invoke("hardness", {"mineral": "cheese"}, context=CONTEXT)
        invalid = await agent.registry.invoke("add", {"a": "x", "b": 1}, context=CONTEXT)
        density = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "rocks", "tool": "rock.density", "arguments": {"mineral": "granite"}},
            context=CONTEXT)
    assert set(listed) == {"add", "hardness", "mcp_list_servers", "mcp_get_tool_schema", "mcp_invoke_tool"}
    assert density.content == "granite: 2.7"
    [skipped] = [r.getMessage() for r in caplog.records if "not offering its tool" in r.getMessage()]
    assert "MCP server 'rocks'" in skipped and "'rock.density'" in skipped and "is not allowed" in skipped
    assert listed["add"].source == "mcp:rocks" and listed["add"].description == "Add two integers."
    assert listed["add"].parameters["required"] == ["a", "b"]
    assert added.content == "42"
    assert failed.error.code == "ExecutionFailed" and "unknown mineral 'cheese'" in failed.error.message
    assert invalid.error.code == "InvalidArguments"


async def test_management_tools_list_describe_and_invoke_the_declared_tools(http_server, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tools=[
        mcp_tool("rock_hardness", {"server": "rocks", "url": http_server, "tool": "hardness"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        servers = await agent.registry.invoke("mcp_list_servers", {}, context=CONTEXT)
        schema = await agent.registry.invoke(
            "mcp_get_tool_schema", {"server": "ROCKS", "tool": "hardness"}, context=CONTEXT)
        called = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "rocks", "tool": "hardness", "arguments": {"mineral": "talc"}},
            context=CONTEXT)
        unknown = await agent.registry.invoke("mcp_invoke_tool", {"server": "granite", "tool": "add"}, context=CONTEXT)
        named = await agent.registry.invoke("rock_hardness", {"mineral": "quartz"}, context=CONTEXT)
    assert servers.content == "- rocks (streamable-http): hardness"
    assert json.loads(schema.content)["parameters"]["properties"]["mineral"]["type"] == "string"
    assert called.content == "talc: 1" and named.content == "quartz: 7"
    assert unknown.error.code == "InvalidArguments" and "connected servers: rocks" in unknown.error.message


async def test_management_tools_cannot_reach_undeclared_or_blacklisted_server_tools(http_server, scripted_llm):
    """Only `hardness` is declared: `add` on the same server stays out of reach, through every door."""
    config = agent_config(llm_url=scripted_llm.url, tool_blacklist=["add"], tools=[
        mcp_tool("rock_hardness", {"server": "rocks", "url": http_server, "tool": "hardness"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        invoked = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "rocks", "tool": "add", "arguments": {"a": 1, "b": 2}}, context=CONTEXT)
        schema = await agent.registry.invoke("mcp_get_tool_schema", {"server": "rocks", "tool": "add"},
                                             context=CONTEXT)
    assert invoked.error.code == schema.error.code == "ToolNotFound"
    assert "'add' on MCP server 'rocks' is not one of this agent's tools; reachable here: hardness" in (
        invoked.error.message)


async def test_management_tools_honour_the_blacklist_on_a_whole_server(http_server, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tool_blacklist=["add"], tools=[
        mcp_tool("rocks", {"server": "rocks", "url": http_server, "tool": "*"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        servers = await agent.registry.invoke("mcp_list_servers", {}, context=CONTEXT)
        invoked = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "rocks", "tool": "add", "arguments": {"a": 1, "b": 2}}, context=CONTEXT)
        direct = await agent.registry.invoke("add", {"a": 1, "b": 2}, context=CONTEXT)
        allowed = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "rocks", "tool": "hardness", "arguments": {"mineral": "diamond"}},
            context=CONTEXT)
    assert servers.content == "- rocks (streamable-http): hardness, rock.density"
    assert invoked.error.code == direct.error.code == "Blacklisted"
    assert allowed.content == "diamond: 10"


async def test_a_named_tool_over_sse_takes_the_servers_schema(sse_server, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tools=[
        mcp_tool("rock_add", {"server": "rocks", "url": sse_server, "transport": "sse", "tool": "add"},
                 description="Add with rocks.")])
    async with AgentRuntime.from_config(config, env={}) as agent:
        tool = agent.registry.get("rock_add")
        outcome = await agent.registry.invoke("rock_add", {"a": 5, "b": 6}, context=CONTEXT)
    assert tool.description == "Add with rocks." and tool.parameters["required"] == ["a", "b"]
    assert outcome.content == "11"


async def test_a_stdio_server_is_started_and_called(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tools=[mcp_tool(
        "hardness", {"server": "local-rocks", "transport": "stdio", "command": [sys.executable, SERVER, "stdio"],
                     "tool": "hardness"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        outcome = await agent.registry.invoke("hardness", {"mineral": "diamond"}, context=CONTEXT)
        source = agent.registry.get("hardness").source
    assert outcome.content == "diamond: 10" and source == "mcp:local-rocks"


async def test_a_server_tool_whose_name_is_taken_twice_is_skipped_not_fatal(http_server, scripted_llm, caplog):
    taken = [
        ResolvedTool(definition=ToolDefinition(function=FunctionDefinition(name=name, description="mine")),
                     source=f"tool:{name}", backend=RestBackend(url="http://127.0.0.1:9/x"))
        for name in ("add", "rocks_add")
    ]
    config = agent_config(llm_url=scripted_llm.url, tools=[
        *taken, mcp_tool("rocks", {"server": "rocks", "url": http_server, "tool": "*"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        sources = {t.name: t.source for t in agent.registry.list()}
        hardness = await agent.registry.invoke("hardness", {"mineral": "talc"}, context=CONTEXT)
    assert sources["add"] == "tool:add" and sources["rocks_add"] == "tool:rocks_add"
    assert hardness.content == "talc: 1"
    [skipped] = [r.getMessage() for r in caplog.records if "'add'" in r.getMessage()]
    assert "not offering its tool 'add'" in skipped and "already exists" in skipped


async def test_a_server_that_cannot_list_its_tools_is_reported_and_the_agent_starts(scripted_llm, caplog):
    config = agent_config(llm_url=scripted_llm.url, tools=[mcp_tool(
        "broken", {"server": "broken", "transport": "stdio", "command": [sys.executable, SERVER, "stdio-unlistable"],
                   "tool": "*"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        assert agent.ready
        servers = await agent.registry.invoke("mcp_list_servers", {}, context=CONTEXT)
    assert "cannot list its tools" in servers.content and "the tool catalogue is being rebuilt" in servers.content
    assert any("'broken' is connected but cannot list its tools" in r.getMessage() for r in caplog.records)


async def test_a_server_that_is_down_does_not_stop_the_agent(scripted_llm):
    with socket.socket() as bound:  # bound, never listening: connections are refused and nobody else gets the port
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/mcp"
        config = agent_config(llm_url=scripted_llm.url, tools=[mcp_tool(
            "weather", {"server": "weather", "url": url, "tool": "forecast"}, description="Forecast.")])
        outcome, servers = await down_server_outcomes(config)
    assert (outcome.error.code, outcome.error.retryable) == ("Unavailable", True)
    assert "MCP server 'weather'" in outcome.error.message
    assert "unavailable" in servers.content


async def down_server_outcomes(config):
    async with AgentRuntime.from_config(config, env={}) as agent:
        assert agent.ready
        outcome = await agent.registry.invoke("weather", {}, context=CONTEXT)
        servers = await agent.registry.invoke("mcp_list_servers", {}, context=CONTEXT)
    return outcome, servers
