"""An Agent's `spec.scriptLimits` end to end (issue 12, bug 4).

The Agent is resolved into its config by the operator's own function, the agent's tool asks through
the client an agent process builds, the scripts-manager checks the limits against its maximums, and
the sandbox gets them: a script pod's requests and limits, the local sandbox's memory rlimit.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from rockbot.agent.registry import ToolContext, ToolOutcome
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import MemoryBus, Principal
from rockbot.contracts.agent_config import AgentConfig
from rockbot.kube import AGENTS, KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import manager_and_agent
from tests.kubeapi import KubeApiEmulator
from tests.operator.samples import agent, agent_body
from tests.operator.test_resolving import resolve
from tests.scripts_manager.conftest import MakeSettings, node

ANALYST = Principal.agent(namespace="default", name="analyst")

GREEDY = "x = bytearray(100 * 2**20)\nprint('allocated')"


@dataclass
class PodsManager:
    start: Callable[..., Awaitable[None]]  # the manager, with the analyst's Agent of these scriptLimits
    bus: MemoryBus  # the analyst's
    pods: list[dict[str, Any]]


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
) -> AsyncIterator[PodsManager]:
    """A pod-backed manager that takes each agent's limits from its Agent, as the chart's does."""

    async def start(**script_limits: Any) -> None:
        body = agent_body(ANALYST.name, ANALYST.namespace, builtinTools=["scripts"], scriptLimits=script_limits)
        await kube.create(AGENTS, namespace=ANALYST.namespace, body=body)
        settings = make_settings(scripts_backend="pods", scripts_agent_limits="agents", namespaces=["default"])
        manager = ScriptsManager(settings=settings, bus=manager_bus)
        await manager.start()
        stack.push_async_callback(manager.stop)

    async with contextlib.AsyncExitStack() as stack:
        manager_bus, bus = await stack.enter_async_context(manager_and_agent(ANALYST))
        kubelet = await stack.enter_async_context(node(kube_api, kube))
        yield PodsManager(start=start, bus=bus, pods=kubelet.seen)


async def test_an_agents_cpu_and_memory_become_its_script_pods_requests_and_limits(
    pods_manager: PodsManager,
) -> None:
    await pods_manager.start(cpu="250m", memory="128Mi")
    outcome = await run_tool(resolved(cpu="250m", memory="128Mi"), pods_manager.bus, "print(6 * 7)")
    assert outcome.error is None and "--- stdout ---\n42\n" in outcome.content, outcome
    (pod,) = pods_manager.pods
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {
        "cpu": "250m", "memory": "128Mi", "ephemeral-storage": "128Mi"}


async def test_a_request_asking_for_more_than_its_agent_gets_its_agents_limits(pods_manager: PodsManager) -> None:
    """Issue 18 P3: the pod's resources come from the sender's Agent; the request may only ask for less."""
    await pods_manager.start(cpu="250m", memory="128Mi")
    greedy = await run_tool(resolved(cpu="1", memory="1Gi"), pods_manager.bus, "print(1)")
    modest = await run_tool(resolved(cpu="100m", memory="64Mi"), pods_manager.bus, "print(2)")
    assert greedy.error is None and modest.error is None, (greedy, modest)
    limits = [pod["spec"]["containers"][0]["resources"]["limits"] for pod in pods_manager.pods]
    assert [(lim["cpu"], lim["memory"]) for lim in limits] == [("250m", "128Mi"), ("100m", "64Mi")]


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [({"cpu": "4"}, "cpu=4 is over this scripts-manager's maximum of 1 (ROCKBOT_SCRIPTS_MAX_CPU)"),
     ({"memory": "8Gi"}, "memory=8Gi is over this scripts-manager's maximum of 1Gi (ROCKBOT_SCRIPTS_MAX_MEMORY)")],
)
async def test_limits_over_the_managers_maximum_are_refused_naming_the_field(
    pods_manager: PodsManager, limits: dict[str, str], fragment: str
) -> None:
    await pods_manager.start(**limits)
    outcome = await run_tool(resolved(**limits), pods_manager.bus, "print(1)")
    assert outcome.error is not None and outcome.error.code == "InvalidArguments", outcome
    assert fragment in outcome.error.message and "spec.scriptLimits" in outcome.error.message
    assert pods_manager.pods == []


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
