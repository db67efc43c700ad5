"""The operator as `helm install` runs it: the chart's settings (JSON logs), a uid with no passwd entry, a
read-only root filesystem, HOME on /tmp, PID 1; a broker that comes late or goes away; SIGTERM. It reaches the
real API server and watches the test's namespace as its release namespace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from rockbot.kube import AGENTS, DEPLOYMENTS, SCHEDULED_TASKS, TOOLS, KubeClient
from tests.fixtures.kube_real import KubeCluster
from tests.fixtures.rabbitmq import RabbitBroker
from tests.operator.audit import AuditLog
from tests.operator.conftest import OPERATOR_USER
from tests.operator.deployed import DeployedOperator, start_operator
from tests.operator.harness import condition
from tests.operator.samples import agent_body, tool_body
from tests.operator.test_operator_e2e import create_basics
from tests.pod_process import PodProcess, wait_until, waiting_for_the_broker
from tests.waiting import eventually

#: How long SIGTERM may take to stop a process: a pod is killed 30 s after it by default.
STOP_WITHIN = 10.0


@pytest.fixture
async def start(kube: KubeClient, kube_namespace: str, operator_kubeconfig: str,
                render: Callable[..., list[dict[str, Any]]],
                pods: list[PodProcess]) -> Callable[..., DeployedOperator]:
    """Starts the operator with the test's namespace as its release namespace, which holds the Secrets an Agent
    needs."""
    await create_basics(kube, kube_namespace)

    def start_in_namespace(*, broker: RabbitBroker | None) -> DeployedOperator:
        return start_operator(render, None, pods, broker=broker, kubeconfig=operator_kubeconfig,
                              namespace=kube_namespace)

    return start_in_namespace


async def deployed(kube: KubeClient, ns: str, agent: str = "analyst") -> dict:
    return await kube.get(DEPLOYMENTS, namespace=ns, name=f"rockbot-{agent}")


async def test_the_operator_starts_as_the_chart_runs_it_and_reconciles(kube: KubeClient, kube_namespace: str, start):
    operator = start(broker=None)  # no broker: scheduling off
    await operator.wait_live()
    await kube.create(AGENTS, namespace=kube_namespace, body=agent_body(namespace=kube_namespace))
    await eventually(lambda: deployed(kube, kube_namespace), within=30)


async def test_json_logs_keep_every_per_object_record(kube: KubeClient, kube_namespace: str, start):
    ns = kube_namespace
    operator = start(broker=None)  # no broker: scheduling off
    await kube.create(TOOLS, namespace=ns, body=tool_body("bad", namespace=ns, parameters={"type": "string"}))
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns, tools=["bad", "ghost"]))

    async def reported() -> None:
        tools = condition(await kube.get(AGENTS, namespace=ns, name="analyst"), "ToolsResolved")
        assert tools["status"] == "False"

    await eventually(reported, within=30)
    await eventually(lambda: deployed(kube, ns), within=30)
    operator.process.terminate()
    await operator.process.exited(within=STOP_WITHIN)
    records = operator.process.records()  # every line is one JSON object
    assert not [line for line in operator.process.lines() if "Logging error" in line]
    about_the_agent = [r for r in records if (r.get("object") or {}).get("name") == "analyst"]
    assert about_the_agent, "records about the Agent are in the log, with the object they are about"
    assert all(r["object"]["kind"] == "Agent" and r["object"]["namespace"] == ns for r in about_the_agent)


async def test_live_while_the_broker_is_unreachable_and_ready_once_it_answers(kube: KubeClient, kube_namespace: str,
                                                                             start, late_rabbitmq):
    operator = start(broker=late_rabbitmq)
    await operator.wait_live()
    # Why, without the password: its own login (scheduling) and the management API (provisioning).
    saying = "cannot reach the broker at amqp://service.operator:***@127.0.0.1"
    await wait_until(waiting_for_the_broker(operator.probes, saying), within=30,
                     what="not ready, waiting for the broker", process=operator.process)
    await kube.create(AGENTS, namespace=kube_namespace, body=agent_body(namespace=kube_namespace))
    await eventually(lambda: deployed(kube, kube_namespace), within=30)  # Agents do not wait for the broker
    await asyncio.to_thread(late_rabbitmq.start)  # the operator provisions it, its own login included
    await wait_until(operator.probes.ready, within=30, what="ready once the broker answers", process=operator.process)
    assert await operator.probes.live()


async def test_sigterm_stops_the_operator_within_seconds_when_the_broker_is_gone(start, late_rabbitmq):
    await asyncio.to_thread(late_rabbitmq.start)  # the operator provisions it, its own login included
    operator = start(broker=late_rabbitmq)
    # The broker started late: the operator's connect retries back off, so give it a minute on a loaded machine.
    await wait_until(lambda: "scheduling started" in operator.process.output(), within=60,
                     what="scheduling started", process=operator.process)
    await asyncio.to_thread(late_rabbitmq.stop_server)
    operator.process.terminate()
    code = await operator.process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{operator.process.output()[-3000:]}"


async def test_the_scheduler_follows_the_operators_own_watch_of_agents(kube: KubeClient, kube_namespace: str,
                                                                     kube_cluster: KubeCluster, start, late_rabbitmq):
    """One stream of Agent events for the whole operator: the scheduler hears of an Agent from the operator's watch
    (a task waiting for its Agent learns at once that it exists), and watches no Agent itself."""
    ns = kube_namespace
    begun = AuditLog(kube_cluster.kubeconfig.parent / "logs" / "audit.log", namespace=ns, stage="ResponseStarted")
    await asyncio.to_thread(late_rabbitmq.start)
    operator = start(broker=late_rabbitmq)
    # The broker started late: the operator's connect retries back off, so give it a minute on a loaded machine.
    await wait_until(lambda: "scheduling started" in operator.process.output(), within=60,
                     what="scheduling started", process=operator.process)
    await kube.create(SCHEDULED_TASKS, namespace=ns, body={
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask", "metadata": {"name": "report"},
        "spec": {"agentRef": {"name": "analyst"}, "schedule": "0 0 1 1 *", "prompt": "Write the report."}})

    def agent_ready_reason(reason: str) -> Callable[[], Any]:
        async def probe() -> None:
            task = await kube.get(SCHEDULED_TASKS, namespace=ns, name="report")
            assert condition(task, "AgentReady")["reason"] == reason

        return probe

    await eventually(agent_ready_reason("AgentNotFound"), within=30)
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns))
    await eventually(agent_ready_reason("AgentNotReady"), within=30)  # no pod runs here: known, not Ready

    watches = [e.resource for e in begun.read() if e.user == OPERATOR_USER and e.verb == "watch"]
    assert "scheduledtasks" in watches, f"the scheduler's own watch was not seen begun: {watches}"
    assert watches.count("agents") == 1, f"Agents watched {watches.count('agents')} times: {watches}"
