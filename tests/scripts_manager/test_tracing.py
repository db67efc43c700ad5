"""A script run's spans: the manager's run in the asking agent's trace, and each backend's steps."""

from __future__ import annotations

from opentelemetry import trace

from rockbot.agent.sandbox import ScriptSandbox
from rockbot.kube import KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.telemetry import tracer
from tests.buses import ALICE, manager_and_agent
from tests.fixtures.tracing import Spans
from tests.kubeapi import KubeApiEmulator
from tests.scripts_manager.conftest import MakeSettings, node, pod_backend
from tests.scripts_manager.test_pool import pool_full, pooled

#: The word to the agent that its script is taken comes right before the sandbox starts.
STEPS = ["queue wait", "publish RequestAccepted", "start-up", "run", "cleanup"]


def job(request_id: str, **limits: str) -> ScriptJob:
    return ScriptJob(request_id=request_id, script="print(6 * 7)", input_data=None, timeout_seconds=10, **limits)


def children(spans: Spans, parent) -> list[str]:
    return [span.name for span in sorted(spans.all(), key=lambda s: s.start_time) if spans.parent_of(span) is parent]


async def test_a_script_run_is_a_span_of_the_asking_agents_trace_with_its_steps(
    make_settings: MakeSettings, spans: Spans
) -> None:
    async with manager_and_agent() as (manager_bus, agent_bus):
        manager = ScriptsManager(settings=make_settings(), bus=manager_bus)
        await manager.start()
        try:
            sandbox = ScriptSandbox(bus=agent_bus, namespace=ALICE.namespace, agent=ALICE.name)
            with tracer.start_as_current_span("tool call") as caller:
                reply = await sandbox.execute_python_script(script="print(6 * 7)", request_id="call-1")
        finally:
            await manager.stop()
    assert reply.stdout == "42\n"
    run = spans.one("run script")
    assert run.context.trace_id == caller.get_span_context().trace_id
    assert spans.ancestors(run) == ["process ScriptInvokeRequest", "publish ScriptInvokeRequest", "tool call"]
    assert children(spans, run) == STEPS
    assert run.attributes["rockbot.script.backend"] == "local"
    assert run.attributes["rockbot.script.outcome"] == "succeeded"
    assert run.attributes["rockbot.agent"] == "default/alice"
    assert run.attributes["rockbot.script.request_id"] == "call-1"
    wait = spans.one("queue wait")
    assert wait.start_time <= spans.one("process ScriptInvokeRequest").start_time <= wait.end_time
    assert manager.metrics.registry.get_sample_value("rockbot_scripts_queue_wait_seconds_count",
                                                     {"backend": "local"}) == 1


async def test_a_refused_request_is_an_error_on_its_run_span(make_settings: MakeSettings, spans: Spans) -> None:
    async with manager_and_agent() as (manager_bus, agent_bus):
        manager = ScriptsManager(settings=make_settings(), bus=manager_bus)
        await manager.start()
        try:
            sandbox = ScriptSandbox(bus=agent_bus, namespace=ALICE.namespace, agent=ALICE.name)
            reply = await sandbox.execute_python_script(script="print(1)", pip_packages=["numpy"])
        finally:
            await manager.stop()
    run = spans.one("run script")
    assert run.attributes["rockbot.script.outcome"] == reply.error.code.value == "Rejected"
    assert run.status.status_code == trace.StatusCode.ERROR and children(spans, run) == ["queue wait"]


async def test_a_cold_pod_and_a_warm_pod_show_their_start_up_run_and_cleanup(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings, spans: Spans
) -> None:
    async with pod_backend(pooled(make_settings, 1)) as backend, node(kube_api, kube):
        await pool_full(kube, backend, 1)
        for request_id, limits in (("warm-1", {}), ("cold-1", {"memory": "128Mi"})):  # 128Mi: no pool class
            with tracer.start_as_current_span(request_id):
                assert (await backend.run(job(request_id, **limits))).stdout == "42\n"
    for request_id, path in (("warm-1", "warm"), ("cold-1", "cold")):
        parent = spans.one(request_id)
        steps = [span for span in spans.all() if spans.parent_of(span) is parent]
        assert sorted(span.name for span in steps) == ["cleanup", "run", "start-up"]
        assert len({span.attributes["k8s.pod.name"] for span in steps}) == 1  # one pod, named on every step
        assert {span.attributes.get("rockbot.script.path") for span in steps} == {path, None}
