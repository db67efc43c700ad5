"""An Agent's `spec.scriptLimits` end to end (issue 12, bug 4).

The Agent is resolved into its config by the operator's own function, the agent's tool asks through
the client an agent process builds, the scripts-manager checks the limits against its maximums, and
the sandbox gets them: a script pod's requests and limits, the local sandbox's memory rlimit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from rockbot.agent.registry import ToolContext, ToolOutcome
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import MemoryBus, Principal
from rockbot.contracts.agent_config import AgentConfig
from rockbot.kube import KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import manager_and_agent
from tests.kubeapi import KubeApiEmulator
from tests.operator.samples import agent
from tests.operator.test_resolving import resolve
from tests.scripts_manager.conftest import MakeSettings, node

ANALYST = Principal.agent(namespace="default", name="analyst")

GREEDY = "x = bytearray(100 * 2**20)\nprint('allocated')"


def resolved(**script_limits: Any) -> AgentConfig:
    """The config the operator writes for an Agent with these scriptLimits and the `scripts` tools."""
    return resolve(agent(builtinTools=["scripts"], scriptLimits=script_limits)).config


async def run_tool(config: AgentConfig, bus: MemoryBus, script: str) -> ToolOutcome:
    sandbox = ScriptSandbox.for_agent(bus=bus, config=config)
    async with AgentRuntime.from_config(config, env={}, sandbox=sandbox) as runtime:
        return await runtime.registry.invoke(
            "execute_python_script", {"script": script}, context=ToolContext(session_id="s", tool_call_id="c1")
        )


@pytest.fixture
async def pods_manager(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> AsyncIterator[tuple[MemoryBus, list[dict[str, Any]]]]:
    async with manager_and_agent(ANALYST) as (manager_bus, bus), node(kube_api, kube) as kubelet:
        manager = ScriptsManager(settings=make_settings(scripts_backend="pods"), bus=manager_bus)
        await manager.start()
        try:
            yield bus, kubelet.seen
        finally:
            await manager.stop()


async def test_an_agents_cpu_and_memory_become_its_script_pods_requests_and_limits(
    pods_manager: tuple[MemoryBus, list[dict[str, Any]]],
) -> None:
    bus, pods = pods_manager
    outcome = await run_tool(resolved(cpu="250m", memory="128Mi"), bus, "print(6 * 7)")
    assert outcome.error is None and "--- stdout ---\n42\n" in outcome.content, outcome
    (pod,) = pods
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {
        "cpu": "250m", "memory": "128Mi", "ephemeral-storage": "128Mi"}


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [({"cpu": "4"}, "cpu=4 is over this scripts-manager's maximum of 1 (ROCKBOT_SCRIPTS_MAX_CPU)"),
     ({"memory": "8Gi"}, "memory=8Gi is over this scripts-manager's maximum of 1Gi (ROCKBOT_SCRIPTS_MAX_MEMORY)")],
)
async def test_limits_over_the_managers_maximum_are_refused_naming_the_field(
    pods_manager: tuple[MemoryBus, list[dict[str, Any]]], limits: dict[str, str], fragment: str
) -> None:
    bus, pods = pods_manager
    outcome = await run_tool(resolved(**limits), bus, "print(1)")
    assert outcome.error is not None and outcome.error.code == "InvalidArguments", outcome
    assert fragment in outcome.error.message and "spec.scriptLimits" in outcome.error.message
    assert pods == []


async def test_the_local_sandbox_limits_memory_to_the_agents_script_limits(make_settings: MakeSettings) -> None:
    async with manager_and_agent(ANALYST) as (manager_bus, bus):
        manager = ScriptsManager(settings=make_settings(scripts_backend="local"), bus=manager_bus)
        await manager.start()
        try:
            small = await run_tool(resolved(memory="96Mi"), bus, GREEDY)
            default = await run_tool(resolved(), bus, GREEDY)
        finally:
            await manager.stop()
    assert "ran out of memory" in small.content, small
    assert "--- stdout ---\nallocated" in default.content and "ran out of memory" not in default.content, default
