"""The Trigger resource: a webhook or a Kubernetes event starts an agent run, exactly once per delivery.

The gateway (`rockbot gateway`) serves it; its status records every delivery before the run is sent,
so a retried webhook, a second gateway replica or a restart never starts one twice.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from rockbot.resources.common import (
    Condition,
    KubeName,
    ListSet,
    LocalObjectReference,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
    SecretKeyRef,
)
from rockbot.resources.runs import LAST_OUTCOME, LAST_OUTCOME_HELP, ActiveRun, ConcurrencyPolicy, RunRecord

#: An HTTP header name (an RFC 9110 token, kept to the characters headers use in practice).
HEADER = r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$"
#: A media type without parameters, as `Content-Type` names it.
MEDIA_TYPE = r"^[a-z0-9][a-z0-9.+-]*/[a-z0-9][a-z0-9.+-]*$"
#: A Kubernetes object name (a DNS subdomain: Events name objects of every kind).
OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MiB = 1024 * 1024
#: The longest delivery id kept (a GitHub delivery is a 36-character UUID).
MAX_DELIVERY_ID = 128


class WebhookSignature(Schema):
    """The HMAC-SHA256 of the raw body: GitHub's X-Hub-Signature-256 (sha256=<hex>) unless set otherwise."""

    header: Annotated[str, Field(pattern=HEADER)] = Field(
        default="X-Hub-Signature-256", description="The header that carries the signature."
    )
    prefix: Annotated[str, Field(max_length=64)] = Field(
        default="sha256=", description="What comes before the digest in the header; empty for none."
    )
    encoding: Literal["hex", "base64"] = Field(
        default="hex", description="How the signature's digest is written: hex or base64."
    )


class WebhookSource(Schema):
    """An HTTPS endpoint served by the gateway at /hooks/<namespace>/<name> (its full URL is in the status)."""

    secret_key_ref: SecretKeyRef = Field(description="The key of the HMAC-SHA256 signature, as the sender has it.")
    signature: WebhookSignature = Field(default_factory=WebhookSignature)
    delivery_id_header: Annotated[str, Field(pattern=HEADER)] = Field(
        default="X-GitHub-Delivery",
        description="The idempotency key: a delivery id seen before is answered 409 and not run again. Without "
        "the header, the SHA-256 of the body is the delivery id.",
    )
    content_types: Annotated[list[Annotated[str, Field(pattern=MEDIA_TYPE)]], ListSet(), Field(max_length=16)] = (
        Field(default=["application/json"], description="Media types accepted; others get 415.")
    )
    max_body_bytes: Annotated[int, Field(ge=1, le=10 * MiB)] = Field(
        default=MiB, description="Larger bodies get 413, unread."
    )


class InvolvedObject(Schema):
    kind: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=63)] | None = Field(
        default=None, description="Kind of the object whose Events count; omit for any."
    )
    name: Annotated[str, Field(pattern=OBJECT_NAME, max_length=253)] | None = Field(
        default=None, description="Name of the object; omit for any."
    )


class KubernetesEventsSource(Schema):
    """Events matching every field set; one incident (an object and a reason) starts one run per window."""

    namespaces: Annotated[list[KubeName], ListSet(), Field(max_length=32)] = Field(
        default_factory=list,
        description="Where to watch; empty: the Trigger's own namespace. Others only if the gateway allows it.",
    )
    involved_object: InvolvedObject | None = Field(
        default=None, description="Which objects' Events count; omit for any."
    )
    type: Literal["Warning", "Normal"] = Field(default="Warning", description="The Event type that counts.")
    reason: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="A regular expression searched in the Event's reason, e.g. BackOff|Failed.*"
    )
    deduplication_window_seconds: Annotated[int, Field(ge=1, le=86_400)] = Field(
        default=600, description="One incident (an object and a reason) starts one run per window of this length."
    )


class TriggerSpec(Schema):
    rules = (
        Rule(
            cel="has(self.webhook) != has(self.kubernetesEvents)",
            message="a Trigger has exactly one source: set webhook or kubernetesEvents",
            holds=lambda t: (t.webhook is None) != (t.kubernetes_events is None),
        ),
    )

    agent_ref: LocalObjectReference = Field(description="The Agent that runs, in this namespace.")
    prompt: Annotated[str, Field(min_length=1, max_length=100_000)] = Field(
        description="A Jinja2 template (sandboxed) of the message the agent gets: webhooks see payload (the "
        "parsed JSON body), body, headers and delivery; events see event; both see trigger."
    )
    when: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="A Jinja2 expression over the same values; when false the delivery is ignored (200), "
        "e.g. payload.action == 'opened'.",
    )
    webhook: WebhookSource | None = None
    kubernetes_events: KubernetesEventsSource | None = None
    suspend: bool = Field(default=False, description="Refuse webhooks (503) and ignore events; nothing is recorded.")
    concurrency_policy: ConcurrencyPolicy = Field(
        default="Allow",
        description="While an earlier run goes: Allow, Forbid (refuse it) or Replace (ignore the earlier answer).",
    )
    max_runs_per_minute: Annotated[int, Field(ge=1, le=120)] | None = Field(
        default=None, description="Over it, webhooks get 429 and events are recorded Missed."
    )
    run_timeout_seconds: Annotated[int, Field(ge=1, le=86_400)] = Field(
        default=600, description="Longest a run may take; then it is Failed."
    )
    successful_runs_history_limit: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, description="Successful runs kept in status.history."
    )
    failed_runs_history_limit: Annotated[int, Field(ge=0, le=100)] = Field(
        default=1, description="Failed runs kept in status.history."
    )


class DeliveryRecord(RunRecord):
    delivery_id: str


class DeliveryRun(ActiveRun):
    record: ClassVar[type[RunRecord]] = DeliveryRecord

    delivery_id: str


class SeenDelivery(Schema):
    """A delivery recorded (its run id follows from its id): a copy of it is answered 409 with that run id."""

    id: str
    time: datetime.datetime
    started: bool = Field(description="Whether it started a run (the rate limit counts those).")
    digest: str = Field(default="", description="The body's SHA-256, cut short: only the same body is resent.")


class Incident(Schema):
    """The last run of one incident (an object and a reason) that Events started."""

    key: str
    run_id: str
    time: datetime.datetime


class TriggerStatus(Schema):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    webhook_url: str | None = None
    last_delivery: SeenDelivery | None = None
    active: list[DeliveryRun] = Field(default_factory=list)
    history: list[DeliveryRecord] = Field(default_factory=list)
    deliveries: list[SeenDelivery] = Field(
        default_factory=list, description="The newest deliveries recorded (and all of the last minute)."
    )
    incidents: list[Incident] = Field(default_factory=list)


class Trigger(Resource):
    """A webhook or a Kubernetes event starts an agent run."""

    kind: ClassVar[str] = "Trigger"
    plural: ClassVar[str] = "triggers"
    short_names: ClassVar[list[str]] = ["trg"]
    printer_columns: ClassVar[list[PrinterColumn]] = [
        PrinterColumn(name="Agent", type="string", json_path=".spec.agentRef.name"),
        PrinterColumn(name="Ready", type="string", json_path='.status.conditions[?(@.type=="Ready")].status'),
        PrinterColumn(name="Suspend", type="boolean", json_path=".spec.suspend"),
        PrinterColumn(name="Last", type="date", json_path=".status.lastDelivery.time"),
        PrinterColumn(name="Outcome", type="string", json_path=LAST_OUTCOME, description=LAST_OUTCOME_HELP),
        PrinterColumn(name="URL", type="string", json_path=".status.webhookUrl", priority=1),
        PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),
    ]

    api_version: str = "rockbot.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TriggerSpec
    status: TriggerStatus | None = None


__all__ = ["Trigger", "TriggerSpec", "TriggerStatus"]
