"""Agent-backed Tools: the schema the model is offered and the arguments the call accepts agree."""

from __future__ import annotations

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import LOCAL, MemoryBroker, Principal
from rockbot.bus.admin import provision_agents
from rockbot.operator.resolving import resolve_agent
from rockbot.resources.common import SecretKeyRef
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import Turn
from tests.operator.samples import ALL_SECRETS, agent, agent_body, tool_body

CONTEXT = ToolContext(session_id="s", tool_call_id="c")


def resolved_config(tool: dict, llm_url: str):
    resolution = resolve_agent(
        agent=agent(tools=[tool["metadata"]["name"]], builtinTools=[]),
        tools=[tool],
        agents={"expert": agent_body("expert")},
        secret_keys=ALL_SECRETS,
        bus_secret=SecretKeyRef(name="rockbot-bus", key="amqp-url"),
        http_token_secret=SecretKeyRef(name="rockbot-analyst-http-token", key="token"),
    )
    assert resolution.tool_problems == []
    config = resolution.config
    return config.model_copy(update={"model": config.model.model_copy(update={"base_url": llm_url, "api_key": None})})


async def call_expert(scripted_llm, tool: dict, arguments: dict):
    """Call the tool from an analyst whose config the operator resolved; the expert answers from the script."""
    scripted_llm.play(lambda body: Turn(text=f"expert read: {body['messages'][-1]['content']}"))
    broker = MemoryBroker()
    expert_config = agent_config(llm_url=scripted_llm.url, name="expert", namespace="default")
    analyst_config = resolved_config(tool, scripted_llm.url)
    await provision_agents(broker, [expert_config, analyst_config], scheduler=LOCAL, password=lambda _: "")
    async with (
        broker.connect(Principal.agent(namespace="default", name="expert").user) as expert_bus,
        broker.connect(Principal.agent(namespace="default", name="analyst").user) as analyst_bus,
    ):
        expert = AgentRuntime.from_config(expert_config, bus=expert_bus, env={API_KEY_ENV: "k"})
        async with expert, AgentRuntime.from_config(analyst_config, bus=analyst_bus) as analyst:
            inbox = await serve_inbox(runtime=expert, bus=expert_bus)
            try:
                offered = analyst.registry.get("expert_tool").parameters
                return offered, await analyst.registry.invoke("expert_tool", arguments, context=CONTEXT)
            finally:
                await inbox.close()


async def test_an_agent_tool_with_default_parameters_offers_and_takes_a_message(scripted_llm):
    tool = tool_body("expert-tool", functionName="expert_tool", agent={"name": "expert"})
    offered, outcome = await call_expert(scripted_llm, tool, {"message": "Is granite hard?"})
    assert offered["required"] == ["message"] and offered["properties"]["message"]["type"] == "string"
    assert outcome.content == "expert read: Is granite hard?"


async def test_an_agent_tool_with_its_own_parameters_sends_the_arguments(scripted_llm):
    parameters = {"type": "object", "properties": {"mineral": {"type": "string"}}, "required": ["mineral"]}
    tool = tool_body("expert-tool", functionName="expert_tool", agent={"name": "expert"}, parameters=parameters)
    offered, outcome = await call_expert(scripted_llm, tool, {"mineral": "granite"})
    assert offered == parameters
    assert outcome.content == 'expert read: {"mineral": "granite"}'
