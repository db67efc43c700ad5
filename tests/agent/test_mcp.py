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
from rockbot.agent.toolsets import mcp_servers
from rockbot.contracts.agent_config import (
    FunctionDefinition,
    McpBackend,
    McpServer,
    ResolvedTool,
    RestBackend,
    SecretEnv,
    SecretHeader,
    ToolDefinition,
)
from tests.agent.configs import agent_config

pytestmark = pytest.mark.usefixtures("patient_mcp_start")

SERVER = str(Path(__file__).with_name("mcp_server.py"))
CONTEXT = ToolContext(session_id="s", tool_call_id="c")


def serve(transport: str, *args: str):
    """Start the test server; it binds port 0 itself and prints the port, so there is no port to race for."""
    process = subprocess.Popen([sys.executable, SERVER, transport, *args], stdout=subprocess.PIPE,
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
def private_server():
    """A streamable-HTTP server that answers only requests with `Authorization: Bearer s3cret`."""
    process, port = serve("streamable-http", "s3cret")
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
    assert set(listed) == {"add", "hardness", "authorization", "environment",
                           "mcp_list_servers", "mcp_get_tool_schema", "mcp_invoke_tool"}
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
    assert servers.content == "- rocks (streamable-http): hardness, authorization, environment, rock.density"
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


async def test_a_server_tool_whose_name_is_taken_is_not_offered_and_the_rest_are(http_server, scripted_llm, caplog):
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
    assert skipped.startswith("mcp:rocks and tool:add both offer a tool named 'add', so mcp:rocks is not offered")


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
    assert "ConnectError: All connection attempts failed" in outcome.error.message  # why, not "a TaskGroup failed"
    assert "TaskGroup" not in outcome.error.message
    assert "unavailable" in servers.content


async def down_server_outcomes(config):
    async with AgentRuntime.from_config(config, env={}) as agent:
        assert agent.ready
        outcome = await agent.registry.invoke("weather", {}, context=CONTEXT)
        servers = await agent.registry.invoke("mcp_list_servers", {}, context=CONTEXT)
    return outcome, servers


async def test_a_server_tool_named_like_a_builtin_or_a_declared_tool_is_not_offered_and_the_agent_starts(
    scripted_llm, caplog
):
    """Built-ins first, then declared tools, then what a `tool: "*"` server lists (rockbot.contracts.tool_names)."""
    declared = ResolvedTool(definition=ToolDefinition(function=FunctionDefinition(name="lookup", description="mine")),
                            source="tool:lookup", backend=RestBackend(url="http://127.0.0.1:9/x"))
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["web"], tools=[
        mcp_tool("lookalike", {"server": "lookalike", "transport": "stdio",
                               "command": [sys.executable, SERVER, "stdio-lookalike"], "tool": "*"}),
        declared,
    ])
    async with AgentRuntime.from_config(config, env={}) as agent:
        assert agent.ready
        sources = {t.name: t.source for t in agent.registry.list()}
        defined = await agent.registry.invoke("define", {"term": "granite"}, context=CONTEXT)
        reached = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "lookalike", "tool": "web_browse", "arguments": {"url": "x"}},
            context=CONTEXT)
    assert sources["web_browse"] == sources["mcp_invoke_tool"] == "builtin"
    assert sources["lookup"] == "tool:lookup" and sources["define"] == "mcp:lookalike"
    assert defined.content == "granite: a word"
    assert reached.content == "lookalike fetched x"  # not offered by name, still reachable where declared
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "both offer" in r.getMessage()]
    assert len(warnings) == 3
    [browse] = [w for w in warnings if "'web_browse'" in w]
    assert browse.startswith("mcp:lookalike and builtin:web both offer a tool named 'web_browse', so mcp:lookalike")
    assert "reach it through mcp_invoke_tool" in browse


async def test_a_servers_credentials_come_from_secrets_and_go_to_that_server_only(
    http_server, private_server, scripted_llm
):
    bearer = {"Authorization": SecretHeader(env="ROCKBOT_SECRET_PRIVATE_TOKEN_1", prefix="Bearer ")}
    config = agent_config(llm_url=scripted_llm.url, tools=[
        mcp_tool("private_auth", {"server": "private", "url": private_server, "tool": "authorization",
                                  "headers": bearer}),
        mcp_tool("public_auth", {"server": "public", "url": http_server, "tool": "authorization"}),
    ])
    async with AgentRuntime.from_config(config, env={"ROCKBOT_SECRET_PRIVATE_TOKEN_1": "s3cret"}) as agent:
        private = await agent.registry.invoke("private_auth", {}, context=CONTEXT)
        public = await agent.registry.invoke("public_auth", {}, context=CONTEXT)
    assert private.content == "Bearer s3cret"
    assert public.ok and public.content == ""  # the other server never sees it


async def test_a_server_whose_secret_is_not_in_the_environment_is_unavailable_naming_the_variable(
    private_server, scripted_llm
):
    bearer = {"Authorization": SecretHeader(env="ROCKBOT_SECRET_PRIVATE_TOKEN_1", prefix="Bearer ")}
    config = agent_config(llm_url=scripted_llm.url, tools=[
        mcp_tool("private_auth", {"server": "private", "url": private_server, "tool": "authorization",
                                  "headers": bearer})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        outcome = await agent.registry.invoke("private_auth", {}, context=CONTEXT)
    assert outcome.error.code == "Unavailable"
    assert "header Authorization comes from env var ROCKBOT_SECRET_PRIVATE_TOKEN_1, which is empty" in (
        outcome.error.message)


async def test_a_stdio_server_gets_its_secret_environment_and_not_the_agents(scripted_llm, monkeypatch):
    monkeypatch.setenv("ROCKBOT_MODEL_API_KEY", "sk-agent-only")
    secret_env = {"ROCKS_TOKEN": SecretEnv(env="ROCKBOT_SECRET_ROCKS_1")}
    config = agent_config(llm_url=scripted_llm.url, tools=[mcp_tool("environment", {
        "server": "local-rocks", "transport": "stdio", "command": [sys.executable, SERVER, "stdio"],
        "tool": "environment", "env": secret_env})])
    async with AgentRuntime.from_config(config, env={"ROCKBOT_SECRET_ROCKS_1": "t0k3n"}) as agent:
        token = await agent.registry.invoke("environment", {"name": "ROCKS_TOKEN"}, context=CONTEXT)
        model_key = await agent.registry.invoke("environment", {"name": "ROCKBOT_MODEL_API_KEY"}, context=CONTEXT)
        wired = await agent.registry.invoke("environment", {"name": "ROCKBOT_SECRET_ROCKS_1"}, context=CONTEXT)
    assert token.content == "t0k3n"
    assert model_key.content == wired.content == ""


async def test_only_a_server_the_namespace_declares_can_be_attached_and_then_detached(http_server, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["mcp"], tool_blacklist=["add"],
                          mcp_catalog=[McpServer(server="rocks", url=http_server)])

    async def call(agent, name, **arguments):
        return await agent.registry.invoke(name, arguments, context=CONTEXT)

    async with AgentRuntime.from_config(config, env={}) as agent:
        before = await call(agent, "mcp_list_servers")
        unknown = await call(agent, "mcp_register_server", server="evil")
        commanded = await call(agent, "mcp_register_server", server="rocks", command=["sh", "-c", "id"])
        attached = await call(agent, "mcp_register_server", server="ROCKS")
        hardness = await call(agent, "mcp_invoke_tool", server="rocks", tool="hardness",
                              arguments={"mineral": "talc"})
        blacklisted = await call(agent, "mcp_invoke_tool", server="rocks", tool="add", arguments={"a": 1, "b": 2})
        schemas = await call(agent, "mcp_get_tool_schema", server="rocks")
        detached = await call(agent, "mcp_unregister_server", server="rocks")
        after = await call(agent, "mcp_invoke_tool", server="rocks", tool="hardness", arguments={"mineral": "talc"})
        offered = [tool["function"]["name"] for tool in agent.registry.openai_tools()]
    assert before.content == "- rocks (not attached: mcp_register_server can attach it)"
    assert unknown.error.code == "InvalidArguments" and "attachable: rocks" in unknown.error.message
    assert commanded.error.code == "InvalidArguments"  # a command (or URL) is never taken from the model
    assert attached.content.startswith("Attached MCP server 'rocks'; call its tools with mcp_invoke_tool: hardness")
    assert hardness.content == "talc: 1"
    assert blacklisted.error.code == "Blacklisted"
    assert "add" not in {schema["name"] for schema in json.loads(schemas.content)}
    assert detached.content == "Detached MCP server 'rocks'."
    assert after.error.code == "InvalidArguments" and "attachable with mcp_register_server: rocks" in (
        after.error.message)
    assert sorted(offered) == sorted(["mcp_list_servers", "mcp_get_tool_schema", "mcp_invoke_tool",
                                      "mcp_register_server", "mcp_unregister_server"])


async def test_a_declared_server_cannot_be_detached_and_attaching_needs_the_mcp_set(http_server, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tools=[
        mcp_tool("rock_hardness", {"server": "rocks", "url": http_server, "tool": "hardness"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        names = {tool.name for tool in agent.registry.list()}
    assert "mcp_register_server" not in names and "mcp_invoke_tool" in names
    config = config.model_copy(update={"builtin_tools": ["mcp"]})
    async with AgentRuntime.from_config(config, env={}) as agent:
        refused = await agent.registry.invoke("mcp_unregister_server", {"server": "rocks"}, context=CONTEXT)
    assert refused.error.code == "Rejected" and "comes from this agent's own Tools" in refused.error.message


async def test_a_missing_tool_on_a_whole_server_is_refused_without_naming_blacklisted_ones(http_server, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tool_blacklist=["add"], tools=[
        mcp_tool("rocks", {"server": "rocks", "url": http_server, "tool": "*"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        missing = await agent.registry.invoke(
            "mcp_invoke_tool", {"server": "rocks", "tool": "addition", "arguments": {}}, context=CONTEXT)
    assert missing.error.code == "ToolNotFound" and "'addition'" in missing.error.message
    assert "add," not in missing.error.message and "hardness" in missing.error.message


CRASH = ("import sys; sys.stderr.write('Traceback (most recent call last):\\nRuntimeError: rocks db gone\\n'); "
         "sys.exit(3)")


async def test_a_crashing_stdio_server_is_logged_and_named_not_printed_into_the_chat(scripted_llm, caplog, capfd):
    config = agent_config(llm_url=scripted_llm.url, tools=[mcp_tool(
        "hardness", {"server": "crashy", "transport": "stdio", "command": [sys.executable, "-c", CRASH],
                     "tool": "hardness"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        assert agent.ready
        outcome = await agent.registry.invoke("hardness", {"mineral": "talc"}, context=CONTEXT)
        notices = list(agent.notices)
    assert "rocks db gone" not in capfd.readouterr().err  # the server's stderr is not the terminal's
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "MCP server 'crashy'" in logged and "RuntimeError: rocks db gone" in logged
    assert notices == ["MCP server 'crashy' failed to start, so its tools answer Unavailable until it is back "
                       "(the log says why)"]
    assert outcome.error.code == "Unavailable"


async def test_a_stdio_server_that_never_initialises_does_not_hold_up_the_start(scripted_llm, monkeypatch):
    monkeypatch.setattr(mcp_servers, "STARTUP_WAIT_SECONDS", 0.2)
    config = agent_config(llm_url=scripted_llm.url, tools=[mcp_tool(
        "hardness", {"server": "mute", "transport": "stdio",
                     "command": [sys.executable, "-c", "import time; time.sleep(600)"], "tool": "hardness"})])
    async with AgentRuntime.from_config(config, env={}) as agent:
        assert agent.ready
        notices = list(agent.notices)
        starting = [tool["function"]["name"] for tool in agent.registry.openai_tools()]
    assert notices == ["MCP server 'mute' is still starting: the agent starts without its tools, which are "
                       "offered once it is ready"]
    assert "hardness" not in starting
