"""An Evaluation run in flight survives its operator's SIGKILL: two operator processes as the chart runs them (a
leader and a standby on a Lease) on the real API server and a real broker; the leader is killed while the agent
holds the cases it sent; the standby takes over, finds the run active in status and runs it again once, says so
(attempt 2, Event EvaluationResumed), and the trend counts the run once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from rockbot.kube import EVALUATIONS, EVENTS, KubeClient
from tests.operator.test_high_availability import Started, holder, pair_with_agent, start_pair, took_over
from tests.pod_process import wait_until
from tests.scheduling.conftest import FakeAgent
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # two operators, a broker, and a Lease's duration to wait out
__all__ = ["pair_with_agent", "start_pair"]  # the fixtures, used by name

CASES = 3


def evaluation() -> dict[str, Any]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": "gate"},
            "spec": {"agentRef": {"name": "helper"}, "concurrency": CASES,
                     "cases": [{"name": f"case-{n}", "input": f"Do {n}.", "expect": {"contains": ["done"]}}
                               for n in range(CASES)]}}  # fmt: skip


async def test_a_run_in_flight_when_the_leader_is_sigkilled_is_run_again_once_by_the_new_leader(
    kube: KubeClient, kube_namespace: str, pair_with_agent: Callable[..., AbstractAsyncContextManager[Started]]
) -> None:
    # The agent holds the cases: the run is in flight when the leader dies.
    async with pair_with_agent(hold=True) as (leader, standby, agent):
        await _kill_the_leader_mid_run(kube, kube_namespace, leader=leader, standby=standby, agent=agent)


async def _kill_the_leader_mid_run(kube: KubeClient, ns: str, *, leader: Any, standby: Any, agent: FakeAgent) -> None:
    held_by = await holder(kube, ns)
    await kube.create(EVALUATIONS, namespace=ns, body=evaluation())

    async def in_flight() -> dict[str, Any]:
        status = (await kube.get(EVALUATIONS, namespace=ns, name="gate")).get("status") or {}
        assert status.get("active") and len(agent.held) == CASES, (status, len(agent.held))
        return status["active"]

    active = await eventually(in_flight, within=60)
    assert active["attempt"] == 1 and active["reason"] == "Spec", active
    leader.process.kill()  # SIGKILL: the Lease is not released, the run's end is never written
    agent.hold = False  # the new leader's cases are answered; the held ones never are
    seconds = await took_over(kube, ns, was=held_by)
    print(f"\ntakeover after the leader's SIGKILL with an Evaluation run in flight: {seconds:.1f} s")
    await wait_until(lambda: "leading: holding the Lease" in standby.process.output(), within=30,
                     what="the standby leading", process=standby.process)  # fmt: skip

    async def ended() -> dict[str, Any]:
        status = (await kube.get(EVALUATIONS, namespace=ns, name="gate")).get("status") or {}
        assert status.get("trend") and not status.get("active"), status
        return status

    status = await eventually(ended, within=120)
    assert [(run["runId"], run["attempts"], run["passed"]) for run in status["trend"]] == [
        (active["runId"], 2, True)
    ], status["trend"]
    assert status["score"] == 1.0 and {c["result"] for c in status["cases"]} == {"Passed"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert f"run {active['runId']} (Spec, attempt 2)" in ready["message"], ready
    events = [(e["reason"], e["message"]) for e in (await kube.list(EVENTS, namespace=ns)).items
              if e["involvedObject"].get("kind") == "Evaluation"]  # fmt: skip
    assert [reason for reason, _ in events].count("EvaluationResumed") == 1, events
    # each case sent twice in all (once per attempt, under new request ids), never a third time
    assert len(agent.received) == 2 * CASES, [r.request_id for r in agent.received]
