"""The operator's Evaluation runner on the real API server and RabbitMQ: cases cross the broker as service.operator to
a real agent runtime (scripted model), a judge graded with the key from the named Secret; status, Events, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import OPERATOR, AmqpBus, Principal
from rockbot.clock import Clock, ManualClock, SystemClock
from rockbot.kube import AGENTS, EVALUATIONS, EVENTS, SECRETS, KubeClient
from rockbot.operator.evaluations import MAX_ATTEMPTS, RUN_REQUESTED, EvaluationRunner
from rockbot.operator.scheduling.firing import Scheduler
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedLLM, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.scheduling.conftest import START, Cluster, FakeAgent
from tests.waiting import eventually

pytestmark = pytest.mark.slow


def helper(body: dict[str, Any]) -> Turn:
    return Turn(text="It is 42." if "40 + 2" in body["messages"][-1]["content"] else "Hello there, friend!")


@pytest.fixture
async def judge_llm():
    server = await ScriptedLLM(model="judge-model", api_key="judge-key", loop=True).start()
    server.play(Turn(text='{"score": 0.9, "reason": "friendly"}'))
    try:
        yield server
    finally:
        await server.stop()


def _evaluation(judge_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": "basics"},
        "spec": {
            "agentRef": {"name": "helper"},
            "judge": {"baseUrl": judge_url, "name": "judge-model", "apiKeySecretRef": {"name": "judge", "key": "k"}},
            "cases": [
                {"name": "sums", "input": "What is 40 + 2?", "expect": {"contains": ["42"]}},
                {"name": "greets", "input": "Say hello.", "expect": {"rubric": {"criteria": "A friendly greeting."}}},
            ],
        },
    }  # fmt: skip


@asynccontextmanager
async def _runners(kube: KubeClient, ns: str, bus: AmqpBus, *, clock: Clock, count: int = 1,
                   registry: CollectorRegistry | None = None) -> AsyncIterator[list[EvaluationRunner]]:  # fmt: skip
    """`count` runners (as replicas that all think they lead) and the Scheduler whose runs queue hands each the
    replies to its cases, started; stopped after."""
    runners = [EvaluationRunner(kube=kube, bus=bus, namespaces=[ns], clock=clock, registry=registry)
               for _ in range(count)]  # fmt: skip

    def hand_over(reply: Any, sender: Principal | None) -> bool:  # one reply queue: to the runner that asked
        return any(r.take_reply(reply, sender) for r in runners if reply.request_id in r._pending)

    scheduler = Scheduler(kube=kube, bus=bus, clock=clock, namespaces=[ns], other_replies=hand_over)
    await scheduler.start()
    for runner in runners:
        await runner.start()
    try:
        yield runners
    finally:
        for runner in runners:
            await runner.stop()
        await scheduler.stop()


@asynccontextmanager
async def _fake_agent_runners(kube: KubeClient, ns: str, vhost: Vhost, *, clock: Clock,
                              count: int = 1) -> AsyncIterator[tuple[FakeAgent, list[EvaluationRunner]]]:  # fmt: skip
    """`_runners` sending to a FakeAgent "helper", which answers every case at once ("done: ...")."""
    agent = Principal.agent(namespace=ns, name="helper")
    async with (
        await AmqpBus.connect(url=await vhost.url(OPERATOR)) as operator_bus,
        await AmqpBus.connect(url=await vhost.url(agent, called_by=[OPERATOR])) as agent_bus,
    ):
        fake = await FakeAgent(bus=agent_bus, namespace=ns, name="helper").start()
        try:
            async with _runners(kube, ns, operator_bus, clock=clock, count=count) as runners:
                yield fake, runners
        finally:
            await fake.stop()


async def _events(kube: KubeClient, namespace: str) -> list[tuple[str, str]]:
    items = (await kube.list(EVENTS, namespace=namespace)).items
    return [(e["type"], e["reason"]) for e in items if e["involvedObject"].get("kind") == "Evaluation"]


async def test_an_applied_evaluation_runs_through_the_agent_and_again_on_a_new_spec_or_request(
    real_kube_client: KubeClient, kube_namespace: str, scripted_llm: ScriptedLLM, judge_llm: ScriptedLLM, vhost: Vhost
) -> None:
    cluster = Cluster(kube=real_kube_client, namespace=kube_namespace)
    kube, ns = cluster.kube, cluster.ns
    await cluster.agent()
    await kube.create(SECRETS, namespace=ns, body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "judge"},
                                                   "stringData": {"k": "judge-key"}})  # fmt: skip
    scripted_llm.loop = True
    scripted_llm.play(helper)
    agent = Principal.agent(namespace=ns, name="helper")
    registry = CollectorRegistry()
    labels = {"namespace": ns, "evaluation": "basics"}
    config = agent_config(llm_url=scripted_llm.url, name="helper", namespace=ns)
    async with (
        await AmqpBus.connect(url=await vhost.url(OPERATOR)) as operator_bus,
        await AmqpBus.connect(url=await vhost.url(agent, called_by=[OPERATOR])) as agent_bus,
        AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, bus=agent_bus) as runtime,
    ):
        inbox = await serve_inbox(runtime=runtime, bus=agent_bus)
        try:
            async with _runners(kube, ns, operator_bus, clock=SystemClock(), registry=registry):
                await kube.create(EVALUATIONS, namespace=ns, body=_evaluation(judge_llm.url))

                async def status(generation: int, runs: int) -> dict[str, Any]:
                    found = (await kube.get(EVALUATIONS, namespace=ns, name="basics")).get("status") or {}
                    assert found.get("observedGeneration") == generation and len(found.get("trend", [])) == runs, found
                    return found

                first = await eventually(lambda: status(1, 1), within=60)
                assert first["score"] == 1.0 and first["model"] == "m" and first["agentGeneration"] == 1
                assert {c["name"]: c["result"] for c in first["cases"]} == {"sums": "Passed", "greets": "Passed"}
                assert next(c for c in first["cases"] if c["name"] == "greets")["score"] == 0.9
                assert {c["type"]: c["status"] for c in first["conditions"]} == {"Ready": "True", "Passed": "True"}
                await eventually(lambda: _has(_events(kube, ns), ("Normal", "EvaluationPassed")))
                assert registry.get_sample_value("rockbot_evaluation_score", labels) == 1

                changed = _evaluation(judge_llm.url)["spec"]["cases"]
                changed[0]["expect"]["contains"] = ["43"]
                await kube.patch(EVALUATIONS, namespace=ns, name="basics", body={"spec": {"cases": changed}})
                second = await eventually(lambda: status(2, 2), within=60)
                assert second["score"] == 0.5 and [run["passed"] for run in second["trend"]] == [True, False]
                sums = next(c for c in second["cases"] if c["name"] == "sums")
                assert sums["result"] == "Failed" and "43" in sums["message"], sums
                assert {c["type"]: c["status"] for c in second["conditions"]}["Passed"] == "False"
                await eventually(lambda: _has(_events(kube, ns), ("Warning", "EvaluationFailed")))
                assert registry.get_sample_value("rockbot_evaluation_score", labels) == 0.5

                await kube.patch(EVALUATIONS, namespace=ns, name="basics",
                                 body={"metadata": {"annotations": {RUN_REQUESTED: "once more"}}})  # fmt: skip
                third = await eventually(lambda: status(2, 3), within=60)
                assert third["runRequested"] == "once more"
        finally:
            await inbox.close()
    assert judge_llm.requests and {r.authorization for r in judge_llm.requests} == {"Bearer judge-key"}


async def _has(events, wanted: tuple[str, str]) -> None:
    found = await events
    assert wanted in found, found


def _watched(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": "nightly"},
            "spec": {"agentRef": {"name": "helper"}, "cases": [{"name": "does", "input": "Do it.",
                                                                "expect": {"contains": ["done"]}}]} | spec}  # fmt: skip


async def test_a_schedule_fires_each_slot_once_across_two_runners_and_a_new_agent_generation_runs_again(
    real_kube_client: KubeClient, kube_namespace: str, vhost: Vhost
) -> None:
    """Two runners (as two replicas that both think they lead) on one driven clock: the spec's run, then each slot
    of an hourly schedule once (of three slots passed at once only the latest), then a run for the Agent's new
    generation; each run is one trend entry, its cases sent once."""
    cluster = Cluster(kube=real_kube_client, namespace=kube_namespace)
    kube, ns = cluster.kube, cluster.ns
    await cluster.agent()
    clock = ManualClock(START)
    async with _fake_agent_runners(kube, ns, vhost, clock=clock, count=2) as (fake, _):
        await kube.create(EVALUATIONS, namespace=ns, body=_watched(schedule="0 * * * *"))

        async def trend(runs: int) -> dict[str, Any]:
            found = (await kube.get(EVALUATIONS, namespace=ns, name="nightly")).get("status") or {}
            assert len(found.get("trend", [])) == runs and not found.get("active"), found
            return found

        first = await eventually(lambda: trend(1), within=30)
        assert first["trend"][0]["reason"] == "Spec" and first["nextRunTime"] == "2024-05-01T11:00:00Z", first
        clock.set(START.replace(hour=11, minute=0, second=1))
        second = await eventually(lambda: trend(2), within=30)
        assert second["trend"][1]["reason"] == "Schedule" and second["nextRunTime"] == "2024-05-01T12:00:00Z"
        clock.set(START.replace(hour=14, minute=30))  # slots 12:00, 13:00 and 14:00 passed: 14:00 runs
        third = await eventually(lambda: trend(3), within=30)
        assert third["trend"][2]["runId"].startswith("20240501T140000Z-"), third["trend"]
        assert third["nextRunTime"] == "2024-05-01T15:00:00Z"

        await kube.patch(AGENTS, namespace=ns, name="helper", body={"spec": {"model": {"name": "m2"}}})
        fourth = await eventually(lambda: trend(4), within=30)
        assert fourth["trend"][3]["reason"] == "AgentChanged" and fourth["agentGeneration"] == 2, fourth
        assert fourth["model"] == "m2" and fourth["score"] == 1.0
        await asyncio.sleep(1)  # a second run of anything would have started by now
        assert len((await trend(4))["trend"]) == 4
        run_ids = [run["runId"] for run in fourth["trend"]]
        assert len(set(run_ids)) == 4, run_ids
        assert len(fake.received) == 4, [r.request_id for r in fake.received]  # one case per run, sent once


async def test_a_run_that_started_max_attempts_times_without_ending_is_given_up_and_said_so(
    real_kube_client: KubeClient, kube_namespace: str, vhost: Vhost
) -> None:
    """A run left active at its last attempt (each operator that ran it stopped before its end) is not run again:
    Ready False RunAbandoned, a Warning Event, nothing sent; the next spec runs anew."""
    cluster = Cluster(kube=real_kube_client, namespace=kube_namespace)
    kube, ns = cluster.kube, cluster.ns
    await cluster.agent()
    await kube.create(EVALUATIONS, namespace=ns, body=_watched())
    active = {"runId": "20240501T102000Z-abcdef12", "reason": "Spec", "startTime": "2024-05-01T10:20:00Z",
              "attempt": MAX_ATTEMPTS}  # fmt: skip
    await kube.patch(EVALUATIONS, namespace=ns, name="nightly", subresource="status",
                     body={"status": {"observedGeneration": 1, "active": active}})  # fmt: skip
    async with _fake_agent_runners(kube, ns, vhost, clock=ManualClock(START)) as (fake, _):

        async def abandoned() -> dict[str, Any]:
            found = (await kube.get(EVALUATIONS, namespace=ns, name="nightly")).get("status") or {}
            assert not found.get("active"), found
            return found

        status = await eventually(abandoned, within=30)
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and ready["reason"] == "RunAbandoned", ready
        assert f"run {active['runId']} (Spec) started {MAX_ATTEMPTS} times" in ready["message"]
        assert not status.get("trend") and fake.received == []
        await eventually(lambda: _has(_events(kube, ns), ("Warning", "EvaluationAbandoned")))

        await kube.patch(EVALUATIONS, namespace=ns, name="nightly", body={"spec": {"repeat": 2}})

        async def ran_anew() -> None:
            found = (await kube.get(EVALUATIONS, namespace=ns, name="nightly")).get("status") or {}
            assert [run["reason"] for run in found.get("trend", [])] == ["Spec"] and found["score"] == 1.0, found

        await eventually(ran_anew, within=30)
        assert len(fake.received) == 2


async def test_an_evaluation_applied_before_its_agent_runs_when_the_agent_appears(
    real_kube_client: KubeClient, kube_namespace: str, vhost: Vhost
) -> None:
    cluster = Cluster(kube=real_kube_client, namespace=kube_namespace)
    kube, ns = cluster.kube, cluster.ns
    async with _fake_agent_runners(kube, ns, vhost, clock=ManualClock(START)) as (fake, _):
        await kube.create(EVALUATIONS, namespace=ns, body=_watched())

        async def refused() -> None:
            found = (await kube.get(EVALUATIONS, namespace=ns, name="nightly")).get("status") or {}
            ready = next((c for c in found.get("conditions", []) if c["type"] == "Ready"), {})
            assert ready.get("reason") == "AgentNotFound" and not found.get("active"), found

        await eventually(refused, within=30)
        await cluster.agent()

        async def ran() -> None:
            found = (await kube.get(EVALUATIONS, namespace=ns, name="nightly")).get("status") or {}
            assert [run["reason"] for run in found.get("trend", [])] == ["AgentChanged"], found
            assert found["agentGeneration"] == 1 and found["score"] == 1.0, found

        await eventually(ran, within=30)
        assert len(fake.received) == 1
