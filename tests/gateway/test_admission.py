"""The gateway's decisions on a Trigger's status, on a driven clock: no API, no bus."""

from __future__ import annotations

import datetime
from typing import Any

from rockbot.gateway.admission import Decision, Offer, admit, complete, expire
from rockbot.resources.agent import SCALED_TO_ZERO
from rockbot.resources.trigger import Trigger, TriggerStatus
from rockbot.runs import AgentState

NOW = datetime.datetime(2024, 5, 1, 10, 0, tzinfo=datetime.UTC)
READY = AgentState(exists=True, ready=True)


def trigger(**spec: Any) -> Trigger:
    source = {} if "kubernetesEvents" in spec else {"webhook": {"secretKeyRef": {"name": "hook", "key": "k"}}}
    return Trigger.model_validate({
        "metadata": {"namespace": "team-a", "name": "issues", "uid": "0123456789abcdef", "generation": 1},
        "spec": {"agentRef": {"name": "triage"}, "prompt": "Triage.", **source, **spec},
    })  # fmt: skip


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


class Book:
    """One Trigger's status as the ledger would keep it."""

    def __init__(self, **spec: Any) -> None:
        self.trigger = trigger(**spec)
        self.status = TriggerStatus()

    def deliver(self, delivery: str, *, when: float = 0, agent: AgentState = READY, **offer: Any) -> Decision:
        return admit(self.trigger, self.status, Offer(delivery_id=delivery, **offer), agent=agent, render_error=None,
                     now=at(when))  # fmt: skip

    def event(self, delivery: str, *, occurred: float, when: float) -> Decision:
        return self.deliver(delivery, when=when, incident="Pod/team-a/web-1/BackOff", occurred=at(occurred))

    def outcomes(self) -> list[str]:
        return [record.outcome for record in self.status.history]


def test_a_webhook_over_the_rate_limit_is_refused_unrecorded_until_the_minute_frees_a_slot() -> None:
    book = Book(maxRunsPerMinute=2)
    assert [book.deliver(f"d-{n}", when=n).outcome for n in range(3)] == ["started", "started", "rate_limited"]
    assert book.deliver("d-2", when=2).retry_after == 58  # d-0 leaves the window at 60 s
    assert [entry.id for entry in book.status.deliveries] == ["d-0", "d-1"]
    assert book.deliver("d-2", when=60).outcome == "started"


def test_forbid_records_a_delivery_that_overlaps_a_run_as_missed_and_replace_ends_the_older_run() -> None:
    forbid = Book(concurrencyPolicy="Forbid")
    first = forbid.deliver("d-1")
    second = forbid.deliver("d-2", when=1)
    assert (first.outcome, second.outcome) == ("started", "missed")
    assert "still running (concurrencyPolicy Forbid)" in second.message
    assert forbid.deliver("d-2", when=2).outcome == "seen"  # a Missed delivery is still a delivery taken
    replace = Book(concurrencyPolicy="Replace")
    older = replace.deliver("d-1")
    replace.deliver("d-2", when=1)
    assert replace.outcomes() == ["Replaced"]
    assert not complete(replace.trigger, replace.status, run=older.run_id, answer="late", error=None, now=at(2))


def test_runs_complete_once_time_out_and_keep_the_history_within_its_limits() -> None:
    book = Book(runTimeoutSeconds=60, successfulRunsHistoryLimit=1, failedRunsHistoryLimit=1)
    runs = [book.deliver(f"d-{n}").run_id for n in range(3)]
    assert complete(book.trigger, book.status, run=runs[0], answer="a", error=None, now=at(5))
    assert not complete(book.trigger, book.status, run=runs[0], answer="again", error=None, now=at(6))
    assert complete(book.trigger, book.status, run=runs[1], answer="b", error=None, now=at(7))
    expire(book.trigger, book.status, now=at(60))
    assert book.outcomes() == ["Succeeded", "Failed"]
    assert book.status.history[0].summary == "b" and "within 60 s" in book.status.history[1].message


def test_a_seen_delivery_is_sent_again_only_while_its_run_is_active_with_the_same_body() -> None:
    book = Book()
    run = book.deliver("d-1", digest="aa").run_id
    assert book.deliver("d-1", digest="aa") == Decision("seen", run_id=run, resend=True)
    assert book.deliver("d-1", digest="bb") == Decision("seen", run_id=run, resend=False)
    complete(book.trigger, book.status, run=run, answer="done", error=None, now=at(1))
    assert book.deliver("d-1", digest="aa") == Decision("seen", run_id=run, resend=False)


def test_webhooks_find_an_agent_that_is_not_ready_unavailable_events_record_it_failed_or_skipped() -> None:
    down = AgentState(exists=True, ready=False, message="0/1 replicas ready")
    webhook = Book()
    assert webhook.deliver("d-1", agent=down).outcome == "unavailable" and webhook.status.deliveries == []
    events = Book(kubernetesEvents={})
    decision = events.deliver("e-1", agent=down, incident="Pod/team-a/web-1/BackOff", occurred=NOW)
    assert decision.outcome == "failed" and "0/1 replicas ready" in decision.message
    assert events.deliver("e-2", incident="Pod/team-a/web-1/BackOff", occurred=NOW).outcome == "folded"
    scaled = AgentState(exists=True, ready=False, reason=SCALED_TO_ZERO, message="spec.replicas is 0")
    assert webhook.deliver("d-2", agent=scaled).message == ("Agent 'triage' is scaled to zero (spec.replicas 0), "
                                                            "so nothing would read the prompt")
    skipped = Book(kubernetesEvents={}).deliver("e-3", agent=scaled, incident="Pod/team-a/web-1/BackOff",
                                               occurred=NOW)  # fmt: skip
    assert (skipped.outcome, skipped.message) == ("missed", "skipped: Agent 'triage' is scaled to zero "
                                                  "(spec.replicas 0), so nothing would read the prompt")


def test_an_incident_starts_one_run_per_window_and_old_occurrences_are_not_news() -> None:
    book = Book(kubernetesEvents={"deduplicationWindowSeconds": 300})
    assert book.event("e/1", occurred=0, when=0).outcome == "started"
    assert book.event("e/2", occurred=299, when=299).outcome == "folded"
    assert book.event("e/2", occurred=299, when=301).outcome == "folded"  # it happened inside the handled window
    assert book.event("e/3", occurred=301, when=301).outcome == "started"
    assert book.event("old/1", occurred=0, when=700).outcome == "stale"  # listed again after a restart
    assert [incident.key for incident in book.status.incidents] == ["Pod/team-a/web-1/BackOff"]


def test_the_deliveries_kept_are_bounded() -> None:
    book = Book()
    for n in range(150):
        run = book.deliver(f"d-{n}", when=n).run_id
        complete(book.trigger, book.status, run=run, answer="ok", error=None, now=at(n))
    assert len(book.status.deliveries) == 100 and book.status.deliveries[0].id == "d-50"
    assert len(book.status.history) == 3
