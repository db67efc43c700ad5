"""One clash rule everywhere: the tools the operator reports in status are the tools the agent offers."""

from __future__ import annotations

import sys

import pytest

from rockbot.agent.runtime import AgentRuntime
from rockbot.operator.resolving import resolve_agent
from rockbot.resources.common import SecretKeyRef
from tests.agent.test_mcp import SERVER
from tests.operator.samples import ALL_SECRETS, agent, agent_body, tool_body

pytestmark = pytest.mark.usefixtures("patient_mcp_start")

LOOKALIKE = {"server": "lookalike", "transport": "stdio", "command": [sys.executable, SERVER, "stdio-lookalike"]}


async def test_the_agent_offers_exactly_the_tools_the_operator_reports(scripted_llm):
    tools = [
        tool_body("browse", functionName="web_browse", rest={"url": "https://api.example/browse"}),
        tool_body("lookup-b", functionName="lookup"),
        tool_body("lookup-a", functionName="lookup"),
        tool_body("define", mcp={**LOOKALIKE, "tool": "define"}),
    ]
    resolution = resolve_agent(
        agent=agent(
            builtinTools=["web", "memory"],
            tools=["browse", "lookup-b", "lookup-a", "define"],
            subAgents=[{"name": "helper", "toolName": "get_from_working_memory"}],
        ),
        tools=tools,
        agents={"helper": agent_body("helper")},
        secret_keys=ALL_SECRETS,
        bus_secret=SecretKeyRef(name="rockbot-bus", key="amqp-url"),
        http_token_secret=SecretKeyRef(name="rockbot-analyst-http-token", key="token"),
    )
    config = resolution.config.model_copy(update={"model": resolution.config.model.model_copy(
        update={"base_url": scripted_llm.url})})
    async with AgentRuntime.from_config(config, env={}) as runtime:
        offered = {(tool["function"]["name"], runtime.registry.get(tool["function"]["name"]).label)
                   for tool in runtime.registry.openai_tools()}
    reported = {(tool.name, tool.source) for tool in resolution.tools}
    assert offered == reported
    assert ("web_browse", "builtin:web") in reported and ("lookup", "tool:lookup-b") in reported
    assert ("define", "mcp:lookalike") in reported and ("mcp_invoke_tool", "builtin:mcp") in reported
    assert len(resolution.tool_problems) == 3  # web_browse, lookup, get_from_working_memory: each names both
