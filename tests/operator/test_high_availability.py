"""Two operator processes as the chart runs them (two replicas electing a leader with a Lease), on the real API
server and a real broker: the standby does nothing while the leader lives; the leader SIGKILLed (no release of
the Lease), the standby takes over, reconciles, and a ScheduledTask due meanwhile fires exactly once; a leader
stopped with SIGTERM hands the Lease on at once."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from rockbot.bus import AccessRefused, AmqpBus
from rockbot.kube import AGENTS, LEASES, SCHEDULED_TASKS, KubeClient, NotFound
from tests.fixtures.rabbitmq import RabbitBroker
from tests.operator.deployed import DeployedOperator, start_operator
from tests.operator.kubelet import pods_ready
from tests.operator.samples import agent_body
from tests.operator.test_as_deployed import STOP_WITHIN, deployed
from tests.operator.test_bus_identities import bus_url
from tests.operator.test_operator_e2e import create_basics
from tests.pod_process import PodProcess, wait_until
from tests.scheduling.conftest import FakeAgent
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # two operators, a broker, and a Lease's duration to wait out

LEASE = "rockbot-operator"
LEADING, STANDING_BY = "leading: holding the Lease", "standing by: the leader Lease"
#: How long a test waits for a takeover (the figure itself is printed; benchmarks/README.md keeps it).
TAKEOVER_BOUND = 60.0


@pytest.fixture
async def start_pair(kube: KubeClient, kube_namespace: str, operator_kubeconfig: str,
                     render: Callable[..., list[dict[str, Any]]], pods: list[PodProcess],
                     late_rabbitmq: RabbitBroker) -> Callable[[], Any]:
    """Starts a broker and two operators in the test's namespace (the release's, which holds the Lease); returns
    (leader, standby) once one leads and the other stands by."""
    await create_basics(kube, kube_namespace)
    await asyncio.to_thread(late_rabbitmq.start)

    def one() -> DeployedOperator:
        return start_operator(render, None, pods, broker=late_rabbitmq, kubeconfig=operator_kubeconfig,
                              namespace=kube_namespace)

    async def pair() -> tuple[DeployedOperator, DeployedOperator]:
        first = one()
        await wait_until(lambda: LEADING in first.process.output(), within=30, what="the first operator leading",
                         process=first.process)
        second = one()
        await wait_until(lambda: STANDING_BY in second.process.output(), within=30,
                         what="the second operator standing by", process=second.process)
        await wait_until(second.probes.ready, within=30, what="the standby ready", process=second.process)
        return first, second

    return pair


Started = tuple[DeployedOperator, DeployedOperator, FakeAgent]


@pytest.fixture
def pair_with_agent(kube: KubeClient, kube_namespace: str,
                    start_pair: Callable[[], Any]) -> Callable[..., AbstractAsyncContextManager[Started]]:  # fmt: skip
    """Starts the pair, then an Agent "helper" (deployed by the leader) and a FakeAgent on the bus login the
    operator made for it: (leader, standby, agent) while the context lasts; `hold`: the agent holds what it is
    sent, unanswered."""
    ns = kube_namespace

    @contextlib.asynccontextmanager
    async def started(*, hold: bool = False) -> AsyncIterator[Started]:
        leader, standby = await start_pair()
        async with pods_ready(kube, ns):
            await kube.create(AGENTS, namespace=ns, body=agent_body("helper", namespace=ns))
            await eventually(lambda: deployed(kube, ns, "helper"), within=30)
            async with await _agent_login(kube, ns, "helper") as bus:
                agent = FakeAgent(bus=bus, namespace=ns, name="helper")
                agent.hold = hold
                await agent.start()
                try:
                    yield leader, standby, agent
                finally:
                    await agent.stop()

    return started


async def holder(kube: KubeClient, ns: str) -> str:
    return (await kube.get(LEASES, namespace=ns, name=LEASE))["spec"].get("holderIdentity") or ""


async def took_over(kube: KubeClient, ns: str, *, was: str) -> float:
    """Seconds until the Lease has a holder other than `was`."""
    began = time.monotonic()

    async def moved() -> None:
        assert await holder(kube, ns) not in ("", was)

    await eventually(moved, within=TAKEOVER_BOUND)
    return time.monotonic() - began


def one_off_schedule(at: datetime.datetime) -> str:
    """A six-field cron expression (with seconds) whose next slot is `at` (UTC)."""
    return f"{at.second} {at.minute} {at.hour} {at.day} {at.month} *"


async def test_the_standby_takes_over_after_the_leaders_sigkill_and_a_task_due_meanwhile_fires_once(
    kube: KubeClient, kube_namespace: str, pair_with_agent: Callable[..., AbstractAsyncContextManager[Started]]
) -> None:
    async with pair_with_agent() as (leader, standby, agent):
        await _fail_over(kube, kube_namespace, leader=leader, standby=standby, agent=agent)


async def _agent_login(kube: KubeClient, ns: str, agent: str, *, within: float = 30) -> AmqpBus:
    """The agent's connection with the login in its bus Secret, once the operator made it and the broker takes it."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await AmqpBus.connect(url=await bus_url(kube, ns, agent))
        except (AccessRefused, NotFound):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _fail_over(kube: KubeClient, ns: str, *, leader: DeployedOperator, standby: DeployedOperator,
                     agent: FakeAgent) -> None:
    held_by = await holder(kube, ns)
    # Every 2 s, so that a fire may be in flight when the leader dies; and one slot due while nobody leads.
    await kube.create(SCHEDULED_TASKS, namespace=ns, body=task("tick", "*/2 * * * * *"))

    async def ticked() -> None:
        status = (await kube.get(SCHEDULED_TASKS, namespace=ns, name="tick")).get("status") or {}
        assert len(status.get("history") or []) >= 2

    await eventually(ticked, within=30)
    due = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=6)).replace(microsecond=0)
    await kube.create(SCHEDULED_TASKS, namespace=ns, body=task("once", one_off_schedule(due)))

    async def planned() -> None:
        status = (await kube.get(SCHEDULED_TASKS, namespace=ns, name="once")).get("status") or {}
        assert status.get("nextScheduleTime"), status

    await eventually(planned, within=10)
    # The standby did nothing while the leader lived: no scheduling, no reconcile, the Lease untouched.
    assert "scheduling started" not in standby.process.output()
    assert not [r for r in standby.process.records() if r.get("object")], "the standby reconciled something"
    assert await holder(kube, ns) == held_by
    assert datetime.datetime.now(datetime.UTC) < due, "the one-off slot came before the leader was killed"

    leader.process.kill()  # SIGKILL: the Lease is not released
    seconds = await took_over(kube, ns, was=held_by)
    print(f"\ntakeover after the leader's SIGKILL: {seconds:.1f} s")
    await wait_until(lambda: LEADING in standby.process.output(), within=30, what="the standby leading",
                     process=standby.process)
    assert "which stopped renewing it" in standby.process.output()
    assert datetime.datetime.now(datetime.UTC) > due, "the one-off slot was not due during the failover"

    await kube.create(AGENTS, namespace=ns, body=agent_body("later", namespace=ns))
    await eventually(lambda: deployed(kube, ns, "later"), within=30)  # the new leader reconciles

    async def fired_once() -> dict[str, Any]:
        status = (await kube.get(SCHEDULED_TASKS, namespace=ns, name="once")).get("status") or {}
        assert status.get("history"), status
        return status

    once = await eventually(fired_once, within=30)
    assert [record["outcome"] for record in once["history"]] == ["Succeeded"]
    assert not once.get("active"), once
    sent = [request.request_id for request in agent.received if "/once/" in request.request_id]
    assert len(set(sent)) == 1, f"the one-off slot was sent as several runs: {sent}"

    async def ticking_again() -> dict[str, Any]:  # slots of after the takeover run (the history keeps a few)
        status = (await kube.get(SCHEDULED_TASKS, namespace=ns, name="tick")).get("status") or {}
        after = [record for record in status["history"] if record["outcome"] == "Succeeded"
                 and datetime.datetime.fromisoformat(record["scheduledTime"]) > due]
        assert len(after) >= 2, status["history"]
        return status

    tick = await eventually(ticking_again, within=30)
    _each_slot_once(tick, [request.request_id for request in agent.received if "/tick/" in request.request_id])


def _each_slot_once(status: dict[str, Any], sent: list[str]) -> None:
    """No slot recorded twice, and every run the agent was sent is one recorded run (a copy sent again after the
    failover carries the same request id, which the agent's inbox answers once)."""
    records = [*status.get("history", []), *status.get("active", [])]
    slots = [record["scheduledTime"] for record in records]
    assert len(slots) == len(set(slots)), f"a slot was recorded twice: {slots}"
    runs = {record["runId"] for record in records}
    assert len(runs) == len(records), f"a run was recorded twice: {records}"
    assert {request_id.rsplit("/", 1)[1] for request_id in sent} <= runs, (sent, records)


def task(name: str, schedule: str) -> dict[str, Any]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask", "metadata": {"name": name},
            "spec": {"agentRef": {"name": "helper"}, "schedule": schedule, "prompt": f"Do {name}.",
                     "concurrencyPolicy": "Allow", "timeZone": "UTC",
                     "successfulRunsHistoryLimit": 100, "failedRunsHistoryLimit": 100}}  # every run stays in sight


async def test_a_leader_stopped_with_sigterm_hands_the_lease_on_at_once(
    kube: KubeClient, kube_namespace: str, start_pair: Callable[[], Any]
) -> None:
    ns = kube_namespace
    leader, standby = await start_pair()
    held_by = await holder(kube, ns)
    leader.process.terminate()
    assert await leader.process.exited(within=STOP_WITHIN) == 0, leader.process.output()[-3000:]
    seconds = await took_over(kube, ns, was=held_by)
    print(f"\ntakeover after the leader's SIGTERM: {seconds:.1f} s")
    await wait_until(lambda: LEADING in standby.process.output(), within=30, what="the standby leading",
                     process=standby.process)
    assert "(took it, released)" in standby.process.output()
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns))
    await eventually(lambda: deployed(kube, ns), within=30)
    standby.process.terminate()  # the new leader stops as cleanly
    assert await standby.process.exited(within=STOP_WITHIN) == 0, standby.process.output()[-3000:]


async def test_a_standby_stops_with_sigterm_and_the_leader_keeps_leading(
    kube: KubeClient, kube_namespace: str, start_pair: Callable[[], Any]
) -> None:
    ns = kube_namespace
    leader, standby = await start_pair()
    held_by = await holder(kube, ns)
    standby.process.terminate()
    assert await standby.process.exited(within=STOP_WITHIN) == 0, standby.process.output()[-3000:]
    renewed = (await kube.get(LEASES, namespace=ns, name=LEASE))["spec"]["renewTime"]

    async def renewed_since() -> None:
        lease = await kube.get(LEASES, namespace=ns, name=LEASE)
        assert lease["spec"]["renewTime"] != renewed and lease["spec"]["holderIdentity"] == held_by

    await eventually(renewed_since, within=15)
    assert leader.process.running


async def test_a_leader_whose_lease_was_taken_exits_at_once(
    kube: KubeClient, kube_namespace: str, start_pair: Callable[[], Any]
) -> None:
    """Another holder on the Lease (a standby that judged this leader dead while it was cut off, say): the leader
    stops working at its next renewal, by exiting (its Deployment restarts it as a standby)."""
    ns = kube_namespace
    leader, _ = await start_pair()
    lease = await kube.get(LEASES, namespace=ns, name=LEASE)
    await kube.replace(LEASES, namespace=ns, name=LEASE,
                       body={**lease, "spec": {**lease["spec"], "holderIdentity": "intruder"}})
    assert await leader.process.exited(within=STOP_WITHIN) == 3, leader.process.output()[-3000:]
    assert "lost the leader Lease" in leader.process.output()
    assert "the Lease is held by intruder now" in leader.process.output()
