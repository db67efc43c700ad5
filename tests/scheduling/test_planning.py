"""The scheduling decisions on a driven clock: policies, catch-up after downtime, history, edits."""

from __future__ import annotations

import copy
import datetime
from typing import Any

from rockbot.operator.conditions import SCALED_TO_ZERO
from rockbot.operator.scheduling.planning import AgentState, Plan, complete_run, plan_task, run_id

UTC = datetime.UTC
READY = AgentState(exists=True, ready=True)


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


class Task:
    """A ScheduledTask body whose status is updated the way the firing loop would write it."""

    def __init__(self, **spec: Any) -> None:
        self.body: dict[str, Any] = {
            "metadata": {"namespace": "team", "name": "report", "uid": "0123456789abcdef", "generation": 1},
            "spec": {"agentRef": {"name": "helper"}, "schedule": "0 * * * *", "prompt": "Write the report."} | spec,
        }

    def step(self, now: str, agent: AgentState = READY) -> Plan:
        plan = plan_task(body=self.body, agent=agent, now=at(now))
        if plan.status is not None:
            self.body["status"] = plan.status
        return plan

    def edit(self, **spec: Any) -> None:
        self.body["spec"].update(spec)
        self.body["metadata"]["generation"] += 1

    def answer(self, run: str, now: str, answer: str | None = "done", error: str | None = None) -> bool:
        status = complete_run(body=self.body, run_id=run, now=at(now), answer=answer, error=error)
        if status is not None:
            self.body["status"] = status
        return status is not None

    @property
    def status(self) -> dict[str, Any]:
        return self.body.get("status") or {}

    def outcomes(self) -> list[tuple[str, str]]:
        return [(record["scheduledTime"], record["outcome"]) for record in self.status.get("history", [])]

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == type_)


def test_a_new_task_schedules_its_next_slot_and_fires_it_once() -> None:
    task = Task()
    plan = task.step("2024-05-01T10:20:00+00:00")
    assert plan.triggers == []
    assert task.status["nextScheduleTime"] == "2024-05-01T11:00:00Z"
    assert plan.wake_at == at("2024-05-01T11:00:00+00:00")
    assert task.condition("Valid")["status"] == "True"

    plan = task.step("2024-05-01T11:00:00.300000+00:00")
    assert [(t.run_id, t.prompt) for t in plan.triggers] == [("20240501T110000Z-01234567", "Write the report.")]
    assert task.status["lastScheduleTime"] == "2024-05-01T11:00:00Z"
    assert task.status["nextScheduleTime"] == "2024-05-01T12:00:00Z"
    assert [run["runId"] for run in task.status["active"]] == ["20240501T110000Z-01234567"]

    again = task.step("2024-05-01T11:00:01+00:00")
    assert again.triggers == [] and again.status is None


def test_run_ids_are_deterministic() -> None:
    slot = at("2024-05-01T11:00:00+00:00")
    assert run_id(uid="abc-123-xyz", scheduled_time=slot) == run_id(uid="abc-123-xyz", scheduled_time=slot)
    assert run_id(uid="abc-123-xyz", scheduled_time=slot) != run_id(uid="def-456", scheduled_time=slot)


def test_the_reply_completes_the_run_once() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00")
    (trigger,) = task.step("2024-05-01T11:00:00+00:00").triggers
    assert task.answer(trigger.run_id, "2024-05-01T11:00:30+00:00", answer="x" * 5000)
    assert task.status["active"] == []
    (record,) = task.status["history"]
    assert record["outcome"] == "Succeeded" and len(record["summary"]) == 1000
    assert record["completionTime"] == "2024-05-01T11:00:30Z"
    assert not task.answer(trigger.run_id, "2024-05-01T11:00:31+00:00"), "a second reply must change nothing"


def test_an_error_reply_fails_the_run() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00")
    (trigger,) = task.step("2024-05-01T11:00:00+00:00").triggers
    task.answer(trigger.run_id, "2024-05-01T11:00:05+00:00", answer=None, error="Timeout: the model was slow")
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Failed")]
    assert task.status["history"][0]["message"] == "Timeout: the model was slow"


def test_a_run_without_reply_fails_after_the_run_timeout() -> None:
    task = Task(runTimeoutSeconds=120)
    task.step("2024-05-01T10:20:00+00:00")
    plan = task.step("2024-05-01T11:00:00+00:00")
    assert plan.wake_at == at("2024-05-01T11:02:00+00:00")
    task.step("2024-05-01T11:02:00+00:00")
    assert task.status["active"] == []
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Failed")]
    assert "within 120 s" in task.status["history"][0]["message"]


def test_forbid_skips_a_slot_while_a_run_is_active() -> None:
    task = Task(concurrencyPolicy="Forbid", runTimeoutSeconds=7200)
    task.step("2024-05-01T10:20:00+00:00")
    first = task.step("2024-05-01T11:00:00+00:00").triggers[0]
    assert task.step("2024-05-01T12:00:00+00:00").triggers == []
    assert task.outcomes() == [("2024-05-01T12:00:00Z", "Missed")]
    assert "Forbid" in task.status["history"][0]["message"]
    assert [run["runId"] for run in task.status["active"]] == [first.run_id]


def test_allow_runs_concurrently() -> None:
    task = Task(concurrencyPolicy="Allow", runTimeoutSeconds=7200)
    task.step("2024-05-01T10:20:00+00:00")
    task.step("2024-05-01T11:00:00+00:00")
    assert len(task.step("2024-05-01T12:00:00+00:00").triggers) == 1
    assert len(task.status["active"]) == 2


def test_replace_ends_the_active_run_and_ignores_its_late_answer() -> None:
    task = Task(concurrencyPolicy="Replace", runTimeoutSeconds=7200)
    task.step("2024-05-01T10:20:00+00:00")
    first = task.step("2024-05-01T11:00:00+00:00").triggers[0]
    second = task.step("2024-05-01T12:00:00+00:00").triggers[0]
    assert [run["runId"] for run in task.status["active"]] == [second.run_id]
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Replaced")]
    assert not task.answer(first.run_id, "2024-05-01T12:00:10+00:00")


def test_starting_deadline_turns_a_late_slot_into_a_missed_run() -> None:
    task = Task(startingDeadlineSeconds=30)
    task.step("2024-05-01T10:20:00+00:00")
    plan = task.step("2024-05-01T11:00:45+00:00")
    assert plan.triggers == []
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Missed")]
    assert "startingDeadlineSeconds" in task.status["history"][0]["message"]
    assert task.status["nextScheduleTime"] == "2024-05-01T12:00:00Z"
    assert len(task.step("2024-05-01T12:00:20+00:00").triggers) == 1


def test_run_once_policy_fires_only_the_latest_missed_slot_after_downtime() -> None:
    task = Task(missedRunPolicy="RunOnce", failedRunsHistoryLimit=5)
    task.step("2024-05-01T10:20:00+00:00")
    plan = task.step("2024-05-01T15:40:00+00:00")
    assert [t.scheduled_time for t in plan.triggers] == [at("2024-05-01T15:00:00+00:00")]
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Missed")]
    assert "from 2024-05-01T11:00:00Z to 2024-05-01T14:00:00Z" in task.status["history"][0]["message"]
    assert task.status["nextScheduleTime"] == "2024-05-01T16:00:00Z"


def test_skip_policy_fires_nothing_after_downtime() -> None:
    task = Task(missedRunPolicy="Skip", failedRunsHistoryLimit=2)
    task.step("2024-05-01T10:20:00+00:00")
    assert task.step("2024-05-01T15:40:00+00:00").triggers == []
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Missed"), ("2024-05-01T15:00:00Z", "Missed")]
    assert task.status["nextScheduleTime"] == "2024-05-01T16:00:00Z"
    assert len(task.step("2024-05-01T16:00:02+00:00").triggers) == 1, "a slot on time still fires"


def test_downtime_of_a_second_schedule_is_not_a_burst() -> None:
    task = Task(schedule="* * * * * *", concurrencyPolicy="Allow")
    task.step("2024-05-01T10:00:00+00:00")
    plan = task.step("2024-05-03T10:00:00.500000+00:00")
    assert len(plan.triggers) == 1
    assert len(task.status["history"]) == 1


def test_run_once_task_fires_one_slot_then_completes() -> None:
    task = Task(runOnce=True, schedule="30 14 * * *")
    task.step("2024-05-01T10:00:00+00:00")
    assert len(task.step("2024-05-01T14:30:00+00:00").triggers) == 1
    assert task.status["completed"] is True
    assert "nextScheduleTime" not in task.status
    assert task.step("2024-05-02T14:30:00+00:00").triggers == []


def test_a_run_once_slot_waits_for_its_agent_instead_of_completing_unrun() -> None:
    task = Task(runOnce=True, schedule="30 14 * * *")
    task.step("2024-05-01T10:00:00+00:00")
    not_ready = AgentState(exists=True, ready=False, message="0/1 replicas ready")
    plan = task.step("2024-05-01T14:30:00+00:00", agent=not_ready)
    assert plan.triggers == [] and plan.wake_at is None, "the agent's change wakes it, not a busy loop"
    assert not task.status.get("completed") and task.outcomes() == []
    assert task.step("2024-05-01T14:40:00+00:00", agent=AgentState(exists=False)).triggers == []
    (trigger,) = task.step("2024-05-01T14:45:00+00:00").triggers
    assert trigger.scheduled_time == at("2024-05-01T14:30:00+00:00")
    assert task.status["completed"] is True


def test_a_slot_of_an_agent_scaled_to_zero_is_skipped_not_sent_nor_failed() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00")
    scaled = AgentState(exists=True, ready=False, reason=SCALED_TO_ZERO, message="spec.replicas is 0: ...")
    plan = task.step("2024-05-01T11:00:00.300000+00:00", agent=scaled)
    assert plan.triggers == []  # nothing reads its inbox: the prompt would wait there for hours
    (record,) = task.status["history"]
    assert (record["outcome"], record["message"]) == ("Missed", "skipped: Agent 'helper' is scaled to zero "
                                                      "(spec.replicas 0), so nothing would read the prompt")
    assert task.condition("AgentReady")["message"] == "spec.replicas is 0: ..."
    assert task.status["nextScheduleTime"] == "2024-05-01T12:00:00Z"  # and the next slot fires when it is back
    (trigger,) = task.step("2024-05-01T12:00:00.300000+00:00").triggers
    assert trigger.scheduled_time == at("2024-05-01T12:00:00+00:00")


def test_a_waiting_run_once_slot_gives_up_at_its_starting_deadline() -> None:
    task = Task(runOnce=True, schedule="30 14 * * *", startingDeadlineSeconds=300)
    task.step("2024-05-01T10:00:00+00:00")
    plan = task.step("2024-05-01T14:30:00+00:00", agent=AgentState(exists=False))
    assert plan.wake_at == at("2024-05-01T14:35:00.000001+00:00")
    assert task.step("2024-05-01T14:35:00.000001+00:00", agent=AgentState(exists=False)).triggers == []
    assert task.outcomes() == [("2024-05-01T14:30:00Z", "Missed")]
    assert task.status["completed"] is True


def test_history_keeps_the_newest_successes_and_failures_within_limits() -> None:
    task = Task(concurrencyPolicy="Allow", successfulRunsHistoryLimit=2, failedRunsHistoryLimit=1)
    task.step("2024-05-01T00:30:00+00:00")
    for hour in range(1, 7):
        (trigger,) = task.step(f"2024-05-01T{hour:02d}:00:00+00:00").triggers
        failed = hour in (2, 4)
        task.answer(trigger.run_id, f"2024-05-01T{hour:02d}:00:09+00:00", answer=None if failed else "ok",
                    error="broke" if failed else None)
    assert task.outcomes() == [
        ("2024-05-01T04:00:00Z", "Failed"),
        ("2024-05-01T05:00:00Z", "Succeeded"),
        ("2024-05-01T06:00:00Z", "Succeeded"),
    ]


def test_missed_slots_never_push_a_failure_out_of_the_history() -> None:
    task = Task(startingDeadlineSeconds=60)
    task.step("2024-05-01T00:30:00+00:00")
    (trigger,) = task.step("2024-05-01T01:00:00+00:00").triggers
    task.answer(trigger.run_id, "2024-05-01T01:00:09+00:00", answer=None, error="broke")
    for hour in (2, 3):
        assert task.step(f"2024-05-01T{hour:02d}:05:00+00:00").triggers == []
    assert task.outcomes() == [("2024-05-01T01:00:00Z", "Failed"), ("2024-05-01T03:00:00Z", "Missed")]


def test_editing_the_schedule_never_fires_a_past_slot() -> None:
    task = Task(schedule="0 12 * * *")
    task.step("2024-05-01T10:00:00+00:00")
    task.edit(schedule="*/5 * * * *")
    plan = task.step("2024-05-01T10:07:00+00:00")
    assert plan.triggers == [] and task.outcomes() == []
    assert task.status["nextScheduleTime"] == "2024-05-01T10:10:00Z"


def test_suspend_stops_firing_and_resuming_does_not_catch_up() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00")
    task.edit(suspend=True)
    task.step("2024-05-01T10:30:00+00:00")
    assert task.condition("Suspended")["status"] == "True"
    assert "nextScheduleTime" not in task.status
    assert task.step("2024-05-01T13:00:00+00:00").triggers == []
    task.edit(suspend=False)
    assert task.step("2024-05-01T13:10:00+00:00").triggers == []
    assert task.outcomes() == []
    assert task.status["nextScheduleTime"] == "2024-05-01T14:00:00Z"
    assert task.condition("Suspended")["status"] == "False"


def test_an_invalid_zone_sets_valid_false_with_the_parser_message() -> None:
    task = Task(timeZone="Europe/Atlantis")
    plan = task.step("2024-05-01T10:20:00+00:00")
    valid = task.condition("Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidTimeZone")
    assert "Europe/Atlantis" in valid["message"] and "timeZone" in valid["message"]
    assert plan.wake_at is None and plan.triggers == []
    task.edit(timeZone="Europe/Berlin")
    task.step("2024-05-01T10:21:00+00:00")
    assert task.condition("Valid")["status"] == "True"
    assert task.status["nextScheduleTime"] == "2024-05-01T11:00:00Z"


def test_an_invalid_cron_sets_valid_false() -> None:
    task = Task(schedule="0 25 * * *")
    task.step("2024-05-01T10:20:00+00:00")
    valid = task.condition("Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSchedule")
    assert "out of range" in valid["message"]


def test_a_missing_agent_fails_the_run_and_keeps_the_schedule() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00", agent=AgentState(exists=False))
    assert task.condition("AgentReady")["reason"] == "AgentNotFound"
    plan = task.step("2024-05-01T11:00:00+00:00", agent=AgentState(exists=False))
    assert plan.triggers == []
    assert task.outcomes() == [("2024-05-01T11:00:00Z", "Failed")]
    assert "'helper' not found" in task.status["history"][0]["message"]
    assert task.status["nextScheduleTime"] == "2024-05-01T12:00:00Z"


def test_an_agent_that_is_not_ready_fails_the_run_with_its_reason() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00")
    not_ready = AgentState(exists=True, ready=False, message="0/1 replicas ready")
    assert task.step("2024-05-01T11:00:00+00:00", agent=not_ready).triggers == []
    assert "0/1 replicas ready" in task.status["history"][0]["message"]
    assert task.condition("AgentReady")["status"] == "False"
    assert len(task.step("2024-05-01T12:00:00+00:00").triggers) == 1
    assert task.condition("AgentReady")["status"] == "True"


def test_planning_twice_from_the_same_state_decides_the_same() -> None:
    task = Task()
    task.step("2024-05-01T10:20:00+00:00")
    snapshot = copy.deepcopy(task.body)
    one = plan_task(body=snapshot, agent=READY, now=at("2024-05-01T11:00:01+00:00"))
    two = plan_task(body=snapshot, agent=READY, now=at("2024-05-01T11:00:01+00:00"))
    assert one == two and len(one.triggers) == 1


def test_dst_slot_is_handled_once_by_the_planner() -> None:
    task = Task(schedule="30 1 * * *", timeZone="America/New_York", concurrencyPolicy="Allow")
    task.step("2024-11-02T12:00:00+00:00")
    fired = []
    for hour in ["2024-11-03T05:30:00+00:00", "2024-11-03T06:30:00+00:00", "2024-11-04T06:30:00+00:00"]:
        fired += [t.scheduled_time for t in task.step(hour).triggers]
    assert fired == [at("2024-11-03T05:30:00+00:00"), at("2024-11-04T06:30:00+00:00")]
