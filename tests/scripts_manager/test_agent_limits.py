"""Issue 18 P3 as a hostile agent tries it: its requests ask for the manager's maximums, but its scripts run with
its Agent's `spec.scriptLimits`, which the manager finds by the request's broker-validated sender (real broker;
the Agents on the real API server, mirrored as the chart's manager mirrors them)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, AmqpBus, Principal
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeResponse
from rockbot.kube import AGENTS, KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from tests.fixtures.rabbitmq import Vhost
from tests.operator.samples import agent_body
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.test_script_limits import GREEDY

WAIT = 60.0
#: What mallory's Agent allows; its requests ask for the manager's maximums (1 CPU, 1Gi, 300 s) instead.
ALLOWED = {"timeoutSeconds": 2, "cpu": "250m", "memory": "96Mi"}


@pytest.fixture
async def manager(
    vhost: Vhost, make_settings: MakeSettings, real_kube_client: KubeClient, kube_namespace: str
) -> AsyncIterator[ScriptsManager]:
    body = agent_body("mallory", kube_namespace, builtinTools=["scripts"], scriptLimits=ALLOWED)
    body["metadata"] = {"name": "mallory", "namespace": kube_namespace}
    await real_kube_client.create(AGENTS, namespace=kube_namespace, body=body)
    settings = make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER), scripts_agent_limits="agents",
                             namespaces=[kube_namespace])  # fmt: skip
    manager = ScriptsManager(settings=settings)
    await manager.start()
    yield manager
    await manager.stop()


async def ask(vhost: Vhost, agent: Principal, script: str, *, timeout_seconds: float = 60) -> object:
    """`script` run as `agent`, asking for the most the manager allows anyone."""
    async with await AmqpBus.connect(url=await vhost.url(agent)) as bus:
        greedy = ScriptSandbox(bus=bus, namespace=agent.namespace, agent=agent.name, cpu="1", memory="1Gi",
                               start_ceiling_seconds=WAIT)  # fmt: skip
        return await greedy.execute_python_script(script=script, timeout_seconds=timeout_seconds)


async def test_a_hostile_agent_asking_for_more_gets_its_agents_limits(
    manager: ScriptsManager, vhost: Vhost, kube_namespace: str
) -> None:
    mallory = Principal.agent(namespace=kube_namespace, name="mallory")
    greedy = await ask(vhost, mallory, GREEDY)
    slow = await ask(vhost, mallory, "import time\ntime.sleep(20)\nprint('finished')", timeout_seconds=30)
    assert isinstance(greedy, ScriptInvokeResponse) and greedy.oom_killed, greedy  # 96Mi, not the 1Gi it asked
    assert isinstance(slow, ScriptInvokeResponse) and slow.timed_out and "finished" not in slow.stdout, slow


async def test_an_agent_the_manager_knows_no_agent_of_runs_nothing(
    manager: ScriptsManager, vhost: Vhost, kube_namespace: str
) -> None:
    ghost = Principal.agent(namespace=kube_namespace, name="ghost")  # a login, but no Agent
    answer = await ask(vhost, ghost, "print('ran')")
    assert isinstance(answer, ScriptInvokeError) and answer.error.code == "Rejected", answer
    assert f"knows no Agent {kube_namespace}/ghost" in answer.error.message
