"""How a pydantic model becomes a message and a received message becomes a model again.

Bodies are JSON (`content_type` `application/json`); the message `type` is the model's class name
and the `x-schema-version` header its `schema_version`, so a consumer can refuse what it cannot read.
Headers also carry the sender's trace context (W3C `traceparent`, `tracestate`) and when it was
sent (`x-published-at-ms`, integer milliseconds since the epoch), so the receiver's work joins the
sender's trace and shows how long the message waited in its queue. A request that wants to hear when a consumer
takes it says how long it waits for that (`x-accept-within-ms`, see `Bus.request`); the consumer's word is a
`RequestAccepted` on the reply queue.
A received message says who sent it (`user_id`, set by the sending connection and checked by the
broker, see `identity`); a consumer bounds what it parses with `max_bytes` before reading a byte
of JSON, so an oversized body never becomes Python objects.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from rockbot.bus.errors import BadMessage, TooLarge
from rockbot.bus.identity import Principal
from rockbot.bus.topology import EXCHANGE

CONTENT_TYPE = "application/json"
SCHEMA_VERSION_HEADER = "x-schema-version"
# Integer milliseconds: AMQP tables (pamqp) encode a Python float as a 32-bit float, off by up to a minute.
PUBLISHED_AT_HEADER = "x-published-at-ms"
#: A request's wait for a consumer to take it, in integer milliseconds (see `Bus.request`).
ACCEPT_WITHIN_HEADER = "x-accept-within-ms"
#: Headers that route a message besides its routing key (copies), or say it was dead-lettered before.
ROUTING_HEADERS = ("CC", "BCC", "x-death")

M = TypeVar("M")


class Outgoing(BaseModel):
    """A message ready for the wire (both bus implementations carry exactly these fields)."""

    model_config = ConfigDict(frozen=True)

    body: bytes
    message_type: str
    schema_version: int
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    #: Discarded undelivered after this long (a request nobody waits for any more is not worth running).
    expires_after_seconds: float | None = None
    #: The requester waits this long for a consumer to say it took the request (`RequestAccepted`); None: no word.
    accept_within_seconds: float | None = None
    #: The sender's trace context (W3C headers); empty when it traces nothing.
    trace_context: dict[str, str] = Field(default_factory=dict)
    published_at: float = Field(default_factory=time.time)


def encode(
    *,
    body: BaseModel,
    message_id: str | None = None,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    expires_after_seconds: float | None = None,
    accept_within_seconds: float | None = None,
    trace_context: Mapping[str, str] | None = None,
) -> Outgoing:
    return Outgoing(
        body=body.model_dump_json().encode(),
        message_type=type(body).__name__,
        schema_version=int(getattr(body, "schema_version", 1)),
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to=reply_to,
        expires_after_seconds=expires_after_seconds,
        accept_within_seconds=accept_within_seconds,
        trace_context=dict(trace_context or {}),
    )


class RequestAccepted(BaseModel):
    """A consumer took a request that asked to hear it (`accept_within_seconds`) and answers it within
    `answer_within_seconds` from now; sent on the request's reply queue with its correlation id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    answer_within_seconds: Annotated[float, Field(gt=0)]


class ReplyAddress(BaseModel):
    """Where the answer to a request goes: a `Delivery`'s `reply_to` and `correlation_id`, kept for answering later
    (by another process, say, that cleans up after the one that took the request)."""

    model_config = ConfigDict(frozen=True)

    reply_to: str
    correlation_id: str | None = None


class Delivery(BaseModel):
    """A received message; the consumer's handler gets one and the bus acks it after the handler."""

    model_config = ConfigDict(frozen=True)

    queue: str
    body: bytes
    content_type: str | None
    message_type: str | None = None
    schema_version: int | None = None
    message_id: str | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    #: The requester waits this long after sending for word that a consumer took it (see `Bus.accept`); None: none.
    accept_within_seconds: float | None = None
    redelivered: bool = False
    #: The broker user that published it (validated by the broker); None when the sender set none.
    user_id: str | None = None
    #: The sender's trace context (W3C headers), and when it was sent (seconds since the epoch), if it said.
    trace_context: dict[str, str] = Field(default_factory=dict)
    published_at: float | None = None
    #: How the broker routed it: the exchange and routing key it was published with (None: not said).
    exchange: str | None = None
    routing_key: str | None = None
    #: The routing headers it carries (`ROUTING_HEADERS`: dead-lettered before, copied to other queues).
    routing_headers: tuple[str, ...] = ()

    def misrouted(self) -> str | None:
        """Why this message did not come straight to its queue, or None.

        Every queue is bound to `rockbot` by its own name, so a message published for it has exactly
        that routing key. Anything else reached it by a side route a sender can build around the
        topic permissions that say who may write to which queue: a copy (`CC`/`BCC`, which RabbitMQ
        checks against topic permissions only from 4.0), a dead-letter relay (`x-death`), another
        exchange bound or set as alternate exchange. Such a message is refused, whoever sent it.
        """
        if self.exchange != EXCHANGE:
            return f"it came through exchange {self.exchange!r}, not {EXCHANGE!r}"
        if self.routing_key != self.queue:
            return f"its routing key {self.routing_key!r} is not the queue's own name (a copy or a relay)"
        if self.routing_headers:
            return f"it carries {', '.join(self.routing_headers)} (a copy or a dead-letter relay)"
        return None

    @property
    def sender(self) -> Principal | None:
        """Who sent it; the bus refuses messages without one before any handler sees them."""
        return Principal.parse(self.user_id)

    def agent_answered_on_own(self, queues: Callable[[Principal], str]) -> Principal | None:
        """The agent that sent this, when `reply_to` is one of its own queues (named from `queues(agent)` on);
        None when the sender is no agent or the answer would go to someone else's queue."""
        sender = self.sender
        if sender is None or sender.kind != "agent" or not (self.reply_to or "").startswith(queues(sender)):
            return None
        return sender

    def json(self, *, max_bytes: int | None = None) -> Any:  # type: ignore[override]
        """The body as plain JSON data; `TooLarge` past `max_bytes`."""
        self._check(max_bytes)
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise BadMessage(f"message on {self.queue!r} is not valid JSON: {exc}") from exc

    def decode(self, model: type[M] | TypeAdapter[M], *, max_bytes: int | None = None) -> M:
        """The body validated as `model` (a pydantic model class or a `TypeAdapter`); `TooLarge` past `max_bytes`."""
        self._check(max_bytes)
        adapter = model if isinstance(model, TypeAdapter) else TypeAdapter(model)
        try:
            return adapter.validate_json(self.body)
        except ValidationError as exc:
            raise BadMessage(f"message on {self.queue!r} does not match the contract: {exc}") from exc

    def check_size(self, max_bytes: int) -> None:
        """`TooLarge` when the body is longer than `max_bytes`: call it before parsing anything."""
        if len(self.body) > max_bytes:
            raise TooLarge(
                f"message on {self.queue!r} has {len(self.body)} bytes, over the {max_bytes} its reader accepts"
            )

    def _check(self, max_bytes: int | None) -> None:
        if max_bytes is not None:
            self.check_size(max_bytes)
        if self.content_type != CONTENT_TYPE:
            raise BadMessage(
                f"message on {self.queue!r} has content type {self.content_type!r}, expected {CONTENT_TYPE!r}"
            )
