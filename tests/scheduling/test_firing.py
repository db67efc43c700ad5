"""Firing through the real API server and the bus: exactly once across restarts, replicas and redelivery."""

from __future__ import annotations

import asyncio
import datetime
import logging

import pytest

from rockbot.clock import ManualClock
from rockbot.kube import SCHEDULED_TASKS
from tests.scheduling.conftest import Cluster, FakeAgent
from tests.scheduling.faulty_link import FaultyLink
from tests.waiting import bounded, eventually

UTC = datetime.UTC


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


async def scheduled(cluster: Cluster, name: str = "report", *, next_at: str) -> dict:
    async def probe() -> dict:
        status = await cluster.status(name)
        assert status.get("nextScheduleTime") == next_at
        return status

    return await eventually(probe)


async def outcomes(cluster: Cluster, expected: list[tuple[str, str]], name: str = "report") -> dict:
    async def probe() -> dict:
        status = await cluster.status(name)
        got = [(record["scheduledTime"], record["outcome"]) for record in status.get("history", [])]
        assert got == expected
        return status

    return await eventually(probe)


async def test_a_task_fires_into_the_agent_inbox_and_the_reply_completes_it(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task()
    await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    status = await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded")])
    (request,) = agent.received
    assert request.kind == "scheduled_task" and request.content == "Write the report."
    assert request.request_id.startswith(f"scheduledtask/{cluster.ns}/report/20240501T110000Z-")
    assert status["history"][0]["summary"] == "done: Write the report."
    assert status["history"][0]["agentRun"] == "agent-run-1"  # the agent's recorded turn
    assert status["lastScheduleTime"] == "2024-05-01T11:00:00Z"
    assert status["nextScheduleTime"] == "2024-05-01T12:00:00Z"
    assert status["active"] == []
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {"Valid": "True", "Suspended": "False", "AgentReady": "True"}


async def test_a_restart_never_starts_the_same_slot_twice(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task()
    agent.hold = True
    first = await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    await scheduled(cluster, next_at="2024-05-01T12:00:00Z")
    await eventually(lambda: _assert_len(agent.received, 1))
    await first.stop()
    await start_scheduler()
    # The new scheduler planned: it found the run active and sent it again under the same request id
    # (the first copy may never have left a crashed operator); the agent's inbox runs a copy once.
    await eventually(lambda: _assert_len(agent.received, 2))
    assert agent.received[0].request_id == agent.received[1].request_id
    for delivery in agent.held:
        await agent.answer(delivery)
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded")])
    agent.hold = False
    clock.set(at("2024-05-01T12:00:00+00:00"))
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded"), ("2024-05-01T12:00:00Z", "Succeeded")])
    assert len({request.request_id for request in agent.received}) == 2


async def test_a_dropped_api_connection_does_not_stop_the_task(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler, faulty_link: FaultyLink, faulty_kube
) -> None:
    await cluster.agent()
    await cluster.task()
    await start_scheduler(kube=faulty_kube)
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    faulty_link.drop_requests(method="PATCH", path_part="/scheduledtasks/report/status")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded")])
    assert faulty_link.dropped == 1
    assert len(agent.received) == 1


async def test_a_task_loop_cancelled_as_a_change_arrives_during_its_backoff_ends(
    cluster: Cluster, clock: ManualClock, start_scheduler, faulty_link: FaultyLink, faulty_kube,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`stop()` cancels each task's loop; a change that wakes the loop in the same instant must not undo that.

    Python 3.11's `asyncio.wait_for` returned the awaited result when the awaiting task was cancelled just as
    the result came, dropping the cancellation: the loop planned again and waited for ever, and `stop()` with it.
    """
    caplog.set_level(logging.WARNING, logger="rockbot.operator.scheduling.firing")
    await cluster.agent()
    await cluster.task()
    scheduler = await start_scheduler(kube=faulty_kube)
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    faulty_link.drop_requests(method="PATCH", path_part="/scheduledtasks/report/status", times=1000)
    clock.set(at("2024-05-01T11:00:00+00:00"))

    async def backing_off() -> None:
        assert "trying again in" in caplog.text

    await eventually(backing_off)
    state = scheduler._tasks[(cluster.ns, "report")]
    assert state.loop is not None
    # In one instant, as a watch event and `stop()` may come: the task changes, and its loop is cancelled.
    scheduler._task_changed(await cluster.kube.get(SCHEDULED_TASKS, namespace=cluster.ns, name="report"))
    state.loop.cancel()
    await bounded(asyncio.gather(state.loop, return_exceptions=True), within=10, what="the cancelled loop to end")
    assert state.loop.cancelled()


async def test_a_run_recorded_but_not_sent_before_a_restart_is_delivered_once(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler, faulty_link: FaultyLink, faulty_kube
) -> None:
    await cluster.agent()
    await cluster.task()
    first = await start_scheduler(kube=faulty_kube)
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    # The write that records the run lands, its answer is lost, and the API stays out of reach:
    # the first operator never learns the run is recorded, so it never publishes it.
    faulty_link.drop_responses(method="PATCH", path_part="/scheduledtasks/report/status", then_go_down=True)
    clock.set(at("2024-05-01T11:00:00+00:00"))

    async def recorded() -> None:
        assert [run["scheduledTime"] for run in (await cluster.status()).get("active", [])] == ["2024-05-01T11:00:00Z"]

    await eventually(recorded)
    await first.stop()
    # A real API server may send the write's watch event before its answer: then the first operator learnt the
    # run was recorded and sent it. Either way the slot reaches the agent under one request id (its inbox runs a
    # copy once) and completes once.
    faulty_link.heal()
    await start_scheduler()
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded")])
    assert len({request.request_id for request in agent.received}) == 1


async def test_two_replicas_fire_each_slot_once(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    for index in range(5):
        await cluster.task(f"report-{index}", schedule="* * * * *", concurrencyPolicy="Allow")
    await start_scheduler()
    await start_scheduler()
    for index in range(5):
        await scheduled(cluster, f"report-{index}", next_at="2024-05-01T10:21:00Z")
    for minute in (21, 22, 23):
        clock.set(at(f"2024-05-01T10:{minute}:00+00:00"))
        await eventually(lambda minute=minute: _assert_len(agent.received, 5 * (minute - 20)))
        for index in range(5):
            await scheduled(cluster, f"report-{index}", next_at=f"2024-05-01T10:{minute + 1}:00Z")
    ids = [request.request_id for request in agent.received]
    assert len(ids) == len(set(ids)) == 15


async def test_a_duplicate_reply_completes_the_run_once(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task(successfulRunsHistoryLimit=5)
    agent.hold = True
    await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    await eventually(lambda: _assert_len(agent.held, 1))
    (delivery,) = agent.held
    await agent.answer(delivery, "first answer")
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded")])
    await agent.answer(delivery, "a second answer to the same trigger")
    # Sentinel: the next slot's answer, queued behind the duplicate, has been recorded.
    clock.set(at("2024-05-01T12:00:00+00:00"))
    await eventually(lambda: _assert_len(agent.held, 2))
    await agent.answer(agent.held[1], "next answer")
    status = await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded"), ("2024-05-01T12:00:00Z", "Succeeded")])
    assert [record["summary"] for record in status["history"]] == ["first answer", "next answer"]


async def test_missed_slots_during_downtime_fire_once_on_restart(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task(missedRunPolicy="RunOnce")
    first = await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    await first.stop()
    clock.set(at("2024-05-01T15:30:00+00:00"))
    await start_scheduler()
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Missed"), ("2024-05-01T15:00:00Z", "Succeeded")])
    assert [request.request_id[-25:-9] for request in agent.received] == ["20240501T150000Z"]


async def test_skip_policy_fires_nothing_after_downtime(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task(missedRunPolicy="Skip", failedRunsHistoryLimit=3)
    first = await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    await first.stop()
    clock.set(at("2024-05-01T15:30:00+00:00"))
    await start_scheduler()
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Missed"), ("2024-05-01T15:00:00Z", "Missed")])
    await scheduled(cluster, next_at="2024-05-01T16:00:00Z")
    assert agent.received == []


async def test_a_missing_agent_fails_the_run_and_the_next_slot_fires_once_it_exists(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.task()
    await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    status = await outcomes(cluster, [("2024-05-01T11:00:00Z", "Failed")])
    assert "'helper' not found" in status["history"][0]["message"]
    assert status["nextScheduleTime"] == "2024-05-01T12:00:00Z"
    await cluster.agent()

    async def agent_ready() -> None:
        conditions = {c["type"]: c["status"] for c in (await cluster.status())["conditions"]}
        assert conditions["AgentReady"] == "True"

    await eventually(agent_ready)
    clock.set(at("2024-05-01T12:00:00+00:00"))
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Failed"), ("2024-05-01T12:00:00Z", "Succeeded")])


async def test_suspend_edit_and_delete_take_effect_at_once(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task()
    await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    await cluster.edit(suspend=True)

    async def suspended() -> None:
        status = await cluster.status()
        assert "nextScheduleTime" not in status
        assert {c["type"]: c["status"] for c in status["conditions"]}["Suspended"] == "True"

    await eventually(suspended)
    clock.set(at("2024-05-01T11:00:00+00:00"))
    await cluster.edit(suspend=False, schedule="*/15 * * * *")
    await scheduled(cluster, next_at="2024-05-01T11:15:00Z")
    assert agent.received == [], "resuming or editing fires no slot from the past"
    await cluster.task("sentinel", schedule="*/15 * * * *")
    await scheduled(cluster, "sentinel", next_at="2024-05-01T11:15:00Z")
    await cluster.kube.delete(SCHEDULED_TASKS, namespace=cluster.ns, name="report")
    clock.set(at("2024-05-01T11:15:00+00:00"))
    # Sentinel: a task due at the same instant has fired and completed.
    await outcomes(cluster, [("2024-05-01T11:15:00Z", "Succeeded")], name="sentinel")
    assert [request.request_id.split("/")[2] for request in agent.received] == ["sentinel"]


async def test_an_invalid_zone_reports_valid_false(cluster: Cluster, clock: ManualClock, start_scheduler) -> None:
    await cluster.task(timeZone="Mars/Olympus_Mons")
    await start_scheduler()

    async def invalid() -> dict:
        status = await cluster.status()
        valid = next((c for c in status.get("conditions", []) if c["type"] == "Valid"), {})
        assert (valid.get("status"), valid.get("reason")) == ("False", "InvalidTimeZone")
        return valid

    valid = await eventually(invalid)
    assert "Mars/Olympus_Mons" in valid["message"]


async def test_a_run_without_reply_times_out(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task(runTimeoutSeconds=90)
    agent.hold = True
    await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    await eventually(lambda: _assert_len(agent.held, 1))
    clock.set(at("2024-05-01T11:01:30+00:00"))
    status = await outcomes(cluster, [("2024-05-01T11:00:00Z", "Failed")])
    assert "within 90 s" in status["history"][0]["message"]
    await agent.answer(agent.held[0])
    # Sentinel: the next slot's answer, queued behind the late one, has been recorded.
    clock.set(at("2024-05-01T12:00:00+00:00"))
    await eventually(lambda: _assert_len(agent.held, 2))
    await agent.answer(agent.held[1])
    await outcomes(cluster, [("2024-05-01T11:00:00Z", "Failed"), ("2024-05-01T12:00:00Z", "Succeeded")])


async def test_dst_fall_back_fires_the_repeated_slot_once(
    cluster: Cluster, agent: FakeAgent, start_scheduler, clock: ManualClock
) -> None:
    """01:30 happens twice in New York on 2024-11-03 (05:30Z EDT, 06:30Z EST); a daily task fires at the first."""
    clock.set(at("2024-11-02T12:00:00+00:00"))
    await cluster.agent()
    await cluster.task(schedule="30 1 * * *", timeZone="America/New_York", successfulRunsHistoryLimit=5)
    await start_scheduler()
    await scheduled(cluster, next_at="2024-11-03T05:30:00Z")
    instant = at("2024-11-03T05:00:00+00:00")
    while instant < at("2024-11-04T07:00:00+00:00"):  # through both 01:30s, minute by minute near them
        instant += datetime.timedelta(minutes=5 if instant.day == 3 and instant.hour < 8 else 60)
        clock.set(instant)
        await eventually(lambda instant=instant: _planned_past(cluster, instant))
    await outcomes(cluster, [("2024-11-03T05:30:00Z", "Succeeded"), ("2024-11-04T06:30:00Z", "Succeeded")])
    await eventually(lambda: _assert_len(agent.received, 2))


async def _planned_past(cluster: Cluster, instant: datetime.datetime) -> None:
    """The scheduler has handled every slot up to `instant` (its cursor is beyond it) and the agent has
    answered the runs it started, so moving the clock on cannot time a run out before its answer is read."""
    status = await cluster.status()
    assert at(status["nextScheduleTime"]) > instant
    assert not status.get("active"), status.get("active")


async def _assert_len(items: list, count: int) -> None:
    assert len(items) == count, f"{len(items)} != {count}"
