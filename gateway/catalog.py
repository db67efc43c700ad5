"""The Triggers the gateway serves, compiled once per generation, their Agents' states, and their conditions.

`Ready` says whether the gateway can take the Trigger's deliveries: its template compiles, its
reason pattern too, its webhook key is readable, it is not suspended, and its Events come from
namespaces it may watch: its own, and others only when the gateway is started with
`cross_namespace_events` (a Trigger reading another namespace's Events hands them to an agent of
its own) and watches them. `AgentReady` reports the Agent apart, as a ScheduledTask does: a webhook
while it is not Ready gets 503.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rockbot.conditions import ConditionUpdate, merge_condition_models
from rockbot.gateway.templates import Prompt, TemplateProblem
from rockbot.resources.trigger import Trigger, TriggerStatus
from rockbot.runs import AgentState

Key = tuple[str, str]


def webhook_path(*, namespace: str, name: str) -> str:
    return f"/hooks/{namespace}/{name}"


@dataclass(frozen=True)
class Entry:
    """One Trigger as served: its model, its compiled prompt and reason pattern, or why it cannot be served."""

    trigger: Trigger
    prompt: Prompt | None
    reason: re.Pattern[str] | None
    #: (reason, message) of a problem in the spec itself; None when it compiles and is allowed.
    problem: tuple[str, str] | None

    @property
    def key(self) -> Key:
        return self.trigger.metadata["namespace"], self.trigger.metadata["name"]

    @property
    def generation(self) -> int | None:
        return self.trigger.metadata.get("generation")

    @property
    def event_namespaces(self) -> list[str]:
        events = self.trigger.spec.kubernetes_events
        if events is None:
            return []
        return list(events.namespaces) or [self.key[0]]


def compile_entry(trigger: Trigger, *, cross_namespace_events: bool, watched: list[str]) -> Entry:
    """`watched`: the namespaces the gateway serves (empty: all)."""
    problem: tuple[str, str] | None = None
    prompt = reason = None
    try:
        prompt = Prompt.compile(prompt=trigger.spec.prompt, when=trigger.spec.when)
    except TemplateProblem as exc:
        problem = ("InvalidTemplate", f"{exc}: fix the Jinja2 syntax")
    events = trigger.spec.kubernetes_events
    if events is not None and events.reason is not None:
        try:
            reason = re.compile(events.reason)
        except re.error as exc:
            problem = problem or ("InvalidReason", f"spec.kubernetesEvents.reason is not a regular expression: {exc}")
    namespace = trigger.metadata["namespace"]
    others = sorted({*(events.namespaces if events else [])} - {namespace})
    unwatched = [other for other in others if watched and other not in watched]
    if others and not cross_namespace_events and problem is None:
        problem = ("NamespaceNotAllowed",
                   f"spec.kubernetesEvents.namespaces names {', '.join(others)}: a Trigger reads Events of its own "
                   "namespace only, unless the gateway runs with ROCKBOT_CROSS_NAMESPACE_EVENTS=true (chart: "
                   "gateway.crossNamespaceEvents)")  # fmt: skip
    elif unwatched and problem is None:
        problem = ("NamespaceNotAllowed",
                   f"spec.kubernetesEvents.namespaces names {', '.join(unwatched)}, which the gateway does not watch "
                   "(chart: agentNamespaces)")  # fmt: skip
    return Entry(trigger=trigger, prompt=prompt, reason=reason, problem=problem)


class Catalog:
    """What the gateway knows: every Trigger it serves and every Agent's readiness."""

    def __init__(self, *, cross_namespace_events: bool = False, namespaces: list[str] | None = None) -> None:
        self._cross_namespace_events = cross_namespace_events
        self._namespaces = list(namespaces or [])
        self.entries: dict[Key, Entry] = {}
        self._agents: dict[Key, AgentState] = {}

    def upsert(self, body: dict[str, Any]) -> Entry | None:
        """Take a Trigger as the API serves it; None (and forgotten) when it does not parse."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        known = self.entries.get(key)
        metadata = body.get("metadata") or {}
        if known is not None and known.generation == metadata.get("generation") and known.trigger.metadata.get(
            "uid"
        ) == metadata.get("uid"):
            return known
        try:
            trigger = Trigger.model_validate({**body, "status": None})
        except ValidationError:
            self.entries.pop(key, None)
            return None
        entry = self.entries[key] = compile_entry(
            trigger, cross_namespace_events=self._cross_namespace_events, watched=self._namespaces
        )
        return entry

    def delete(self, namespace: str, name: str) -> None:
        self.entries.pop((namespace, name), None)

    def set_agent(self, body: dict[str, Any]) -> bool:
        """Take an Agent as the API serves it; True when its readiness changed."""
        metadata = body["metadata"]
        state = AgentState.of(body)
        key = (metadata["namespace"], metadata["name"])
        changed = self._agents.get(key) != state
        self._agents[key] = state
        return changed

    def delete_agent(self, namespace: str, name: str) -> None:
        self._agents.pop((namespace, name), None)

    def agent(self, entry: Entry) -> AgentState:
        return self._agents.get((entry.key[0], entry.trigger.spec.agent_ref.name), AgentState(exists=False))

    def using_agent(self, namespace: str, name: str) -> list[Entry]:
        return [entry for key, entry in self.entries.items()
                if key[0] == namespace and entry.trigger.spec.agent_ref.name == name]  # fmt: skip

    def watching(self, namespace: str) -> list[Entry]:
        """The event Triggers that select Events of `namespace` (and are allowed to)."""
        return [entry for entry in self.entries.values()
                if entry.problem is None and namespace in entry.event_namespaces]  # fmt: skip

    def event_namespaces(self) -> set[str]:
        return {namespace for entry in self.entries.values() if entry.problem is None
                for namespace in entry.event_namespaces}  # fmt: skip


def settle(
    entry: Entry, *, agent: AgentState, secret_problem: str | None, url: str | None, now: datetime.datetime
) -> Callable[[Trigger, TriggerStatus], None]:
    """The change that brings a Trigger's conditions, webhook URL and observed generation up to date."""

    def change(trigger: Trigger, status: TriggerStatus) -> None:
        generation = trigger.metadata.get("generation")
        if generation != entry.generation:
            return  # the entry is of another generation: the newer one settles it
        status.observed_generation = generation
        status.webhook_url = url
        updates = [_ready(entry, secret_problem=secret_problem, url=url),
                   agent.condition(entry.trigger.spec.agent_ref.name)]  # fmt: skip
        status.conditions = merge_condition_models(status.conditions, updates, generation=generation, now=now)

    return change


def _ready(entry: Entry, *, secret_problem: str | None, url: str | None) -> ConditionUpdate:
    spec = entry.trigger.spec
    if entry.problem is not None:
        return ConditionUpdate(type="Ready", status="False", reason=entry.problem[0], message=entry.problem[1])
    if secret_problem is not None:
        return ConditionUpdate(type="Ready", status="False", reason="SecretUnavailable", message=secret_problem)
    if spec.suspend:
        return ConditionUpdate(type="Ready", status="False", reason="Suspended",
                               message="spec.suspend is true: webhooks get 503, events are ignored")  # fmt: skip
    if spec.webhook is not None:
        ref = spec.webhook.secret_key_ref
        message = f"serving POST {url or webhook_path(namespace=entry.key[0], name=entry.key[1])}, signed with the "
        message += f"key {ref.key!r} of Secret {ref.name!r}"
        return ConditionUpdate(type="Ready", status="True", reason="Serving", message=message)
    events = spec.kubernetes_events
    assert events is not None
    message = f"watching {events.type} Events in {', '.join(entry.event_namespaces)}"
    return ConditionUpdate(type="Ready", status="True", reason="Watching", message=message)

