"""What a delivery does to its Trigger's status: the gateway's decisions, as pure functions of (trigger, status, now).

Each function changes the status in place and says what was decided; the ledger runs it on the
stored status and writes the result conditionally, so when two replicas race on one delivery the
one whose write lands decides, and the other decides again on what it wrote (the delivery is seen).

- A delivery id recorded before is `seen` (a webhook answers 409 with its run id); ids are kept
  for the newest `DELIVERIES_KEPT` deliveries, and all of the last minute when a rate limit counts
  them.
- `maxRunsPerMinute` counts the runs started in the last 60 s: a webhook over it is refused
  unrecorded (429, to be sent again), an event is recorded Missed.
- `concurrencyPolicy` and the history are ScheduledTask's (`rockbot.runs`).
- Events: one incident (an object and a reason) starts at most one run per de-duplication
  window; an occurrence older than the window (seen again at a restart) or inside a handled window
  is folded into that run, unrecorded, so a burst costs no writes.
- Webhooks find a suspended Trigger or an Agent that is not Ready unavailable (503, unrecorded: the
  sender may try again); events record a run for the Agent as a ScheduledTask's slot does: Failed,
  or Missed when it is scaled to zero.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from typing import Literal

from rockbot import runs
from rockbot.resources.runs import truncate
from rockbot.resources.trigger import DeliveryRecord, DeliveryRun, Incident, SeenDelivery, Trigger, TriggerStatus
from rockbot.runs import AgentState

#: The kind part of a Trigger run's request id (see `rockbot.runs.request_id`).
KIND = "trigger"
DELIVERIES_KEPT = 100
INCIDENTS_KEPT = 100
RATE_WINDOW = datetime.timedelta(minutes=1)

Outcome = Literal[
    "new", "started", "seen", "rate_limited", "missed", "failed", "folded", "stale", "unavailable", "ignored",
    "undelivered",
]


@dataclass(frozen=True)
class Offer:
    """One delivery: its idempotency key, a digest of its body, and for an event its incident."""

    delivery_id: str
    digest: str = ""
    incident: str | None = None
    occurred: datetime.datetime | None = None


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    run_id: str = ""
    message: str = ""
    #: A rate-limited webhook: when to try again (seconds).
    retry_after: int = 0
    #: A seen delivery whose run is still active with the same body: sending it again is safe (the inbox
    #: answers a copy once), and heals a crash between recording the run and sending it.
    resend: bool = False


def run_id_of(trigger: Trigger, delivery_id: str) -> str:
    key = hashlib.sha256(delivery_id.encode()).hexdigest()[:16]
    return runs.run_id(uid=str(trigger.metadata.get("uid", "")), key=key)


def precheck(trigger: Trigger, status: TriggerStatus, offer: Offer, *, now: datetime.datetime) -> Decision:
    """What can be answered without rendering a prompt (`new`: it has to be rendered and admitted)."""
    spec = trigger.spec
    if spec.suspend:
        return Decision("unavailable", message="the Trigger is suspended (spec.suspend): nothing is recorded")
    if stale(trigger, offer.occurred, now=now):
        return Decision("stale")
    events = spec.kubernetes_events
    seen = next((entry for entry in status.deliveries if entry.id == offer.delivery_id), None)
    if seen is not None:
        run = run_id_of(trigger, seen.id)
        active = any(active.run_id == run for active in status.active)
        return Decision("seen", run_id=run, resend=active and seen.digest == offer.digest)
    if events is not None and offer.incident is not None:
        window = datetime.timedelta(seconds=events.deduplication_window_seconds)
        incident = next((entry for entry in status.incidents if entry.key == offer.incident), None)
        occurred = offer.occurred or now
        if incident is not None and min(now, occurred) < incident.time + window:
            return Decision("folded", run_id=incident.run_id)
    return Decision("new")


def stale(trigger: Trigger, occurred: datetime.datetime | None, *, now: datetime.datetime) -> bool:
    """Whether an event happened before its Trigger's de-duplication window (listed again after a restart)."""
    events = trigger.spec.kubernetes_events
    if events is None or occurred is None:
        return False
    return occurred + datetime.timedelta(seconds=events.deduplication_window_seconds) < now


def admit(
    trigger: Trigger,
    status: TriggerStatus,
    offer: Offer,
    *,
    agent: AgentState,
    render_error: str | None,
    now: datetime.datetime,
) -> Decision:
    """Record the delivery and start its run if it may start; the decision says what happened."""
    checked = precheck(trigger, status, offer, now=now)
    if checked.outcome != "new":
        return checked
    spec = trigger.spec
    event = spec.kubernetes_events is not None
    run = run_id_of(trigger, offer.delivery_id)
    refusal = agent.refusal(spec.agent_ref.name)
    if refusal is not None and not event:
        return Decision("unavailable", message=refusal[1].removeprefix("skipped: "))
    wait = _rate_limited(trigger, status, now=now)
    if wait is not None and not event:
        return Decision("rate_limited", retry_after=wait,
                        message=f"over the rate limit of {spec.max_runs_per_minute} runs per minute "
                        "(maxRunsPerMinute): nothing was recorded; send it again later")  # fmt: skip
    if event:
        _remember_incident(trigger, status, key=offer.incident or offer.delivery_id, run=run, now=now)
    if refusal is not None:
        return _ended(trigger, status, offer, run=run, outcome=refusal[0], message=refusal[1], now=now)
    if wait is not None:
        message = f"skipped: over the rate limit of {spec.max_runs_per_minute} runs per minute (maxRunsPerMinute)"
        return _ended(trigger, status, offer, run=run, outcome="Missed", message=message, now=now)
    if render_error is not None:
        return _ended(trigger, status, offer, run=run, outcome="Failed", message=render_error, now=now)
    started = DeliveryRun(run_id=run, delivery_id=offer.delivery_id, start_time=now)
    skipped = runs.start(status, started, policy=spec.concurrency_policy, now=now)
    if skipped is not None:
        return _ended(trigger, status, offer, run=run, outcome="Missed", message=skipped, now=now)
    _remember(trigger, status, SeenDelivery(id=offer.delivery_id, time=now, started=True, digest=offer.digest),
              now=now)  # fmt: skip
    _trim(trigger, status)
    return Decision("started", run_id=run)


def complete(
    trigger: Trigger, status: TriggerStatus, *, run: str, answer: str | None, error: str | None,
    now: datetime.datetime, agent_run: str = "",
) -> bool:  # fmt: skip
    """The agent answered run `run`; False when it is not active (timed out, replaced, answered before)."""
    if not runs.complete(status, run=run, now=now, answer=answer, error=error, agent_run=agent_run):
        return False
    _trim(trigger, status)
    return True


def expire(trigger: Trigger, status: TriggerStatus, *, now: datetime.datetime) -> None:
    runs.expire(status, timeout_seconds=trigger.spec.run_timeout_seconds, now=now)
    _trim(trigger, status)


def next_expiry(trigger: Trigger, status: TriggerStatus) -> datetime.datetime | None:
    return runs.next_expiry(status, timeout_seconds=trigger.spec.run_timeout_seconds)


def _ended(
    trigger: Trigger, status: TriggerStatus, offer: Offer, *, run: str, outcome: Literal["Failed", "Missed"],
    message: str, now: datetime.datetime,
) -> Decision:  # fmt: skip
    """Record a delivery whose run never started."""
    record = DeliveryRecord(run_id=run, delivery_id=offer.delivery_id, completion_time=now, outcome=outcome,
                            message=truncate(message))  # fmt: skip
    status.history.append(record)
    _remember(trigger, status, SeenDelivery(id=offer.delivery_id, time=now, started=False, digest=offer.digest),
              now=now)  # fmt: skip
    _trim(trigger, status)
    return Decision("failed" if outcome == "Failed" else "missed", run_id=run, message=record.message)


def _rate_limited(trigger: Trigger, status: TriggerStatus, *, now: datetime.datetime) -> int | None:
    """None when a run may start now, else the seconds until one may."""
    limit = trigger.spec.max_runs_per_minute
    if limit is None:
        return None
    recent = sorted(entry.time for entry in status.deliveries if entry.started and entry.time + RATE_WINDOW > now)
    if len(recent) < limit:
        return None
    frees_at = recent[len(recent) - limit] + RATE_WINDOW
    return max(1, int((frees_at - now).total_seconds() + 0.999))


def _remember(trigger: Trigger, status: TriggerStatus, seen: SeenDelivery, *, now: datetime.datetime) -> None:
    status.deliveries.append(seen)
    status.last_delivery = seen
    counted = trigger.spec.max_runs_per_minute is not None
    oldest_kept = len(status.deliveries) - DELIVERIES_KEPT
    status.deliveries = [
        entry for index, entry in enumerate(status.deliveries)
        if index >= oldest_kept or (counted and entry.started and entry.time + RATE_WINDOW > now)
    ]  # fmt: skip


def _remember_incident(trigger: Trigger, status: TriggerStatus, *, key: str, run: str, now: datetime.datetime) -> None:
    events = trigger.spec.kubernetes_events
    assert events is not None
    window = datetime.timedelta(seconds=events.deduplication_window_seconds)
    kept = [entry for entry in status.incidents if entry.key != key and entry.time + window > now]
    status.incidents = [*kept[-(INCIDENTS_KEPT - 1) :], Incident(key=key, run_id=run, time=now)]


def _trim(trigger: Trigger, status: TriggerStatus) -> None:
    spec = trigger.spec
    runs.trim(status, successful_limit=spec.successful_runs_history_limit, failed_limit=spec.failed_runs_history_limit)
