"""Run bookkeeping shared by every process that starts agent runs and records them in a status.

The operator's scheduler (ScheduledTasks) and the gateway (Triggers) record each run before they
send it, and complete it from the agent's reply; both keep the same meanings, from here:
- a run's id ends with the first eight characters of its object's uid, so a reply for a run of an
  earlier object of the same name is told apart; its request id (the inbox request's, and the
  reply's correlation id) names the kind, the object and the run;
- `concurrencyPolicy`: Allow starts runs side by side, Forbid skips a new run while one is active,
  Replace ends the active runs as Replaced (their answers are ignored; the agent is not interrupted);
- an active run ends Succeeded or Failed with the agent's reply, or Failed when none came within
  the run timeout;
- the history keeps the newest successes up to one limit, the newest failures up to another, and
  skipped runs (Missed, Replaced) up to that second limit on their own, so a series of skipped runs
  never pushes out the failure someone needs to read;
- a run for an Agent that is missing or not Ready fails, except one scaled to zero on purpose: that
  run is skipped (Missed), as a suspended one would be.
Pure functions over the status models (`rockbot.resources.runs`): no API, no bus, no clock.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from rockbot.conditions import ConditionUpdate
from rockbot.contracts.inbox import InboxReply
from rockbot.resources.agent import SCALED_TO_ZERO
from rockbot.resources.runs import ActiveRun, ConcurrencyPolicy, RunRecord

A = TypeVar("A", bound=ActiveRun)


class Runs(Protocol[A]):
    """The part of a status that holds runs."""

    active: list[A]
    history: list[RunRecord]


class AgentState(BaseModel):
    """What a run-starter knows of an Agent: whether it exists, and its Ready condition."""

    model_config = ConfigDict(frozen=True)

    exists: bool
    ready: bool = False
    reason: str = ""  # of its Ready condition
    message: str = ""

    @classmethod
    def of(cls, body: dict[str, Any]) -> AgentState:
        """The state of an Agent as the API serves it."""
        conditions = (body.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        return cls(
            exists=True,
            ready=ready is not None and ready.get("status") == "True",
            reason="" if ready is None else str(ready.get("reason") or ""),
            message="" if ready is None else str(ready.get("message") or ready.get("reason") or ""),
        )

    def condition(self, name: str) -> ConditionUpdate:
        """The AgentReady condition of an object whose runs go to the Agent `name`."""
        if not self.exists:
            return ConditionUpdate(type="AgentReady", status="False", reason="AgentNotFound",
                                   message=f"Agent {name!r} not found in this namespace")  # fmt: skip
        if not self.ready:
            return ConditionUpdate(type="AgentReady", status="False", reason="AgentNotReady",
                                   message=self.message or "the Agent has no Ready condition yet")  # fmt: skip
        return ConditionUpdate(type="AgentReady", status="True", reason="AgentReady", message="")

    def refusal(self, name: str) -> tuple[Literal["Failed", "Missed"], str] | None:
        """(outcome, message) of a run that cannot go to the Agent `name` now, or None when it can."""
        if not self.exists:
            return "Failed", f"Agent {name!r} not found in this namespace"
        if self.reason == SCALED_TO_ZERO:  # on purpose, like a suspension: a skipped run, not a failure
            return "Missed", (f"skipped: Agent {name!r} is scaled to zero (spec.replicas 0), "
                              "so nothing would read the prompt")
        if not self.ready:
            return "Failed", f"Agent {name!r} is not Ready: {self.message or 'no Ready condition yet'}"
        return None


def run_id(*, uid: str, key: str) -> str:
    """`<key>-<uid[:8]>`: deterministic, so every replica and a restarted process name a run alike."""
    return f"{key}-{uid[:8]}"


def belongs_to(run: str, *, uid: str) -> bool:
    """Whether `run` is a run of the object with this uid (not of an earlier one by the same name)."""
    return run.endswith("-" + uid[:8])


def request_id(*, kind: str, namespace: str, name: str, run: str) -> str:
    return f"{kind}/{namespace}/{name}/{run}"


def parse_request_id(value: str, *, kind: str) -> tuple[str, str, str] | None:
    """(namespace, name, run id) of a request id of `kind`, or None if it is not one."""
    parts = value.split("/")
    if len(parts) != 4 or parts[0] != kind or not all(parts[1:]):
        return None
    return parts[1], parts[2], parts[3]


def outcome_of(reply: InboxReply) -> tuple[str | None, str | None]:
    """(answer, error) of an agent's reply, the error as `Code: message`."""
    return reply.answer, None if reply.error is None else f"{reply.error.code.value}: {reply.error.message}"


def start(runs: Runs[A], run: A, *, policy: ConcurrencyPolicy, now: datetime.datetime) -> str | None:
    """Make `run` active under `policy`; None when it started, else why it was skipped (to record as Missed)."""
    if runs.active and policy == "Forbid":
        running = ", ".join(active.run_id for active in runs.active)
        return f"skipped: run {running} is still running (concurrencyPolicy Forbid)"
    if policy == "Replace":
        message = f"replaced by run {run.run_id} (concurrencyPolicy Replace); its answer will be ignored"
        runs.history.extend(active.finished(outcome="Replaced", now=now, message=message) for active in runs.active)
        runs.active.clear()
    runs.active.append(run)
    return None


def complete(
    runs: Runs[A], *, run: str, now: datetime.datetime, answer: str | None, error: str | None, agent_run: str = ""
) -> bool:
    """End the active run `run` with the agent's answer or error; False when it is not active (any more)."""
    active = next((candidate for candidate in runs.active if candidate.run_id == run), None)
    if active is None:
        return False
    runs.active.remove(active)
    outcome = "Failed" if error is not None else "Succeeded"
    runs.history.append(active.finished(outcome=outcome, now=now, message=error or "", summary=answer or "",
                                        agent_run=agent_run))  # fmt: skip
    return True


def expire(runs: Runs[A], *, timeout_seconds: int, now: datetime.datetime) -> None:
    """Fail the active runs that got no reply within `timeout_seconds`."""
    limit = datetime.timedelta(seconds=timeout_seconds)
    for active in [active for active in runs.active if active.start_time + limit <= now]:
        runs.active.remove(active)
        message = f"no reply from the agent within {timeout_seconds} s (runTimeoutSeconds)"
        runs.history.append(active.finished(outcome="Failed", now=now, message=message))


def next_expiry(runs: Runs[A], *, timeout_seconds: int) -> datetime.datetime | None:
    """When the first active run times out, if any is active."""
    limit = datetime.timedelta(seconds=timeout_seconds)
    return min((active.start_time + limit for active in runs.active), default=None)


def trim(runs: Runs[A], *, successful_limit: int, failed_limit: int) -> None:
    """Keep the newest records of each kind within its limit, in their order (see the module's docstring)."""
    limits = {"Succeeded": successful_limit, "Failed": failed_limit}
    kinds: dict[str, list[RunRecord]] = {}
    for record in runs.history:
        kinds.setdefault(record.outcome if record.outcome in limits else "skipped", []).append(record)
    keep: set[int] = set()
    for kind, records in kinds.items():
        limit = limits.get(kind, failed_limit)
        keep |= {id(record) for record in records[max(0, len(records) - limit) :]}
    runs.history = [record for record in runs.history if id(record) in keep]
