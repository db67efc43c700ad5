"""What a person sees of scheduled runs: a span named by the run id, counts and lag, Events for trouble."""

from __future__ import annotations

from rockbot.clock import ManualClock
from rockbot.kube import EVENTS
from tests.fixtures.tracing import Spans
from tests.scheduling.conftest import Cluster, FakeAgent
from tests.scheduling.test_firing import _assert_len, at, outcomes, scheduled
from tests.waiting import eventually


def sample(scheduler, name: str, **labels: str) -> float:
    return scheduler.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_fired_run_is_a_span_with_its_run_id_and_the_agents_work_is_its_child(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler, spans: Spans
) -> None:
    await cluster.agent()
    await cluster.task()
    scheduler = await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    status = await outcomes(cluster, [("2024-05-01T11:00:00Z", "Succeeded")])
    run = spans.one("scheduled run")
    assert run.attributes["rockbot.run.id"] == status["history"][0]["runId"]
    assert run.attributes["rockbot.scheduledtask"] == f"{cluster.ns}/report"
    assert not run.attributes["rockbot.run.resent"]
    handled = next(span for span in await spans.ended("process InboxRequest") if span.context.trace_id
                   == run.context.trace_id)
    assert spans.ancestors(handled) == ["publish InboxRequest", "scheduled run"]

    async def counted() -> None:  # just after the status write the API server answered, which the test may see first
        assert sample(scheduler, "rockbot_scheduled_runs_total", outcome="Succeeded") == 1
        assert sample(scheduler, "rockbot_scheduled_run_lag_seconds_count") == 1

    await eventually(counted)
    assert (await cluster.kube.list(EVENTS, namespace=cluster.ns)).items == []  # a success is no news


async def test_a_missed_and_a_failed_run_are_warning_events_on_the_task(
    cluster: Cluster, agent: FakeAgent, clock: ManualClock, start_scheduler
) -> None:
    await cluster.agent()
    await cluster.task(runTimeoutSeconds=3900)  # concurrencyPolicy Forbid: the 12:00 slot overlaps
    agent.hold = True
    scheduler = await start_scheduler()
    await scheduled(cluster, next_at="2024-05-01T11:00:00Z")
    clock.set(at("2024-05-01T11:00:00+00:00"))
    await eventually(lambda: _assert_len(agent.held, 1))
    clock.set(at("2024-05-01T12:00:00+00:00"))
    await scheduled(cluster, next_at="2024-05-01T13:00:00Z")
    clock.set(at("2024-05-01T12:05:00+00:00"))
    status = await outcomes(cluster, [("2024-05-01T12:00:00Z", "Missed"), ("2024-05-01T11:00:00Z", "Failed")])

    async def posted() -> list[dict]:
        events = (await cluster.kube.list(EVENTS, namespace=cluster.ns)).items
        assert len(events) == 2
        return events

    events = {event["reason"]: event for event in await eventually(posted)}
    assert set(events) == {"RunMissed", "RunFailed"}
    missed, failed = status["history"]
    for event, record in ((events["RunMissed"], missed), (events["RunFailed"], failed)):
        assert event["type"] == "Warning"
        assert (event["involvedObject"]["kind"], event["involvedObject"]["name"]) == ("ScheduledTask", "report")
        assert record["runId"] in event["message"] and record["message"] in event["message"]
    assert "still running" in events["RunMissed"]["message"] and "within 3900 s" in events["RunFailed"]["message"]
    assert sample(scheduler, "rockbot_scheduled_runs_total", outcome="Missed") == 1
    assert sample(scheduler, "rockbot_scheduled_runs_total", outcome="Failed") == 1
