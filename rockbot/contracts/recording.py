"""Run events an agent publishes on `console.runs`, and the session-history request it sends to `console.history`.

An agent never holds database credentials: it describes what it did as events, the console writes
them. Every event has an id the agent chose (the console writes each once, by agent and id, so a
redelivered batch is harmless) and names its run. Which agent a run belongs to is never a field:
the console takes it from the broker-validated sender (`Delivery.user_id`).

A run is one turn of an agent: `RunStarted`, then its timeline (`MessageRecorded`,
`ModelRequested`, `ToolCalled`, `ScriptRan`), then `RunEnded`. `MemoryStored` keeps a chunk of the
turn's working memory under the run's conversation (agent, caller, session), for any later turn of
it on any replica; it is no timeline entry. Text fields are cut at
`MAX_TEXT_CHARS` by the sender (the console cuts again, so a hostile sender gains nothing), and the
characters cut are recorded beside the text (`*_cut`).
"""

from __future__ import annotations

import datetime
import hashlib
import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
#: The longest text kept of one message, argument list, result or output stream.
MAX_TEXT_CHARS = 16_000
#: The most events one `RunEvents` message carries, and the largest such message the console reads.
MAX_EVENTS_PER_MESSAGE = 200
MAX_BATCH_BYTES = 1024 * 1024

RunSource = Literal["chat", "http", "a2a", "user_message", "scheduled_task", "trigger", "agent_call", "local", "replay",
                    "evaluation"]
RunOutcome = Literal["Succeeded", "Failed", "Refused", "TimedOut", "Interrupted"]
#: What a run keeps: everything, no text of messages, arguments, results or output, or nothing at all.
RecordMode = Literal["Full", "Metadata", "None"]

Id = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
Label = Annotated[str, Field(max_length=256)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


def run_id_prefix(*, namespace: str, agent: str) -> str:
    """What every run id of one agent starts with: a digest of who it is (80 bits: no other agent's name has it)."""
    return hashlib.sha256(f"agent.{namespace}.{agent}".encode()).hexdigest()[:20] + "-"


def new_run_id(*, namespace: str, agent: str) -> str:
    """A run id of the agent: its prefix, then 96 random bits, so nobody can guess the agent's next run's id, and a
    run id some other agent learns (from an answer) is no id it may record under (`owns_run`)."""
    return run_id_prefix(namespace=namespace, agent=agent) + secrets.token_hex(12)


def owns_run(run_id: str, *, namespace: str, agent: str) -> bool:
    """Whether `run_id` is one of the agent's own (`new_run_id`): the console records an agent's events only there."""
    return run_id.startswith(run_id_prefix(namespace=namespace, agent=agent))


def cut(text: str | None, *, limit: int = MAX_TEXT_CHARS) -> tuple[str, int]:
    """`text` within `limit` characters, and how many characters were cut off its end."""
    text = text or ""
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Id
    run_id: Id
    at: datetime.datetime


class RunStarted(_Event):
    kind: Literal["run_started"] = "run_started"
    source: RunSource
    session_id: Label = ""
    #: Who asked (a bus principal, `http` for the chat endpoint): with the agent and session, the conversation key.
    caller: Label = ""
    #: The calling agent's run (an agent_call's), or the run a `replay` replays.
    parent_run_id: Id | None = None
    request_id: Label = ""
    trace_id: Annotated[str, Field(max_length=32)] = ""
    model: Label = ""
    record: RecordMode = "Full"
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


class MessageRecorded(_Event):
    kind: Literal["message"] = "message"
    role: Literal["system", "user", "assistant", "tool"]
    content: Text = ""
    content_cut: int = 0
    #: An assistant message's tool calls (`[{id, type, function: {name, arguments}}]`), a tool message's call id.
    tool_calls: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    tool_call_id: Label = ""


class ModelRequested(_Event):
    kind: Literal["model_request"] = "model_request"
    model: Label
    status: Label
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_seconds: float = 0.0
    finish_reason: Label = ""


class ToolCalled(_Event):
    kind: Literal["tool_call"] = "tool_call"
    call_id: Label
    name: Label
    source: Label = ""
    arguments: Text = ""
    arguments_cut: int = 0
    result: Text = ""
    result_cut: int = 0
    #: The error code (`rockbot.contracts.errors.ErrorCode`) when the call failed; empty when it succeeded.
    error_code: Label = ""
    duration_seconds: float = 0.0


class ScriptRan(_Event):
    kind: Literal["script_run"] = "script_run"
    call_id: Label = ""
    exit_code: int | None = None
    stdout: Text = ""
    stdout_cut: int = 0
    stderr: Text = ""
    stderr_cut: int = 0
    duration_seconds: float = 0.0
    backend: Label = ""
    pod: Label = ""


class MemoryStored(_Event):
    """A working-memory chunk (see `agent/memory.py`) the run stored, readable by the conversation's later turns."""

    kind: Literal["memory"] = "memory"
    key: Id
    content: Text = ""
    content_cut: int = 0
    #: How long it is kept from `at` (at most a day: working memory is for a conversation's follow-up questions).
    ttl_seconds: Annotated[int, Field(ge=1, le=86_400)]


ApprovalState = Literal["WaitingForApproval", "Approved", "Denied", "TimedOut"]


class ApprovalRecorded(_Event):
    """A tool call waiting for a person (`WaitingForApproval`), then how the wait ended, who decided and why."""

    kind: Literal["approval"] = "approval"
    call_id: Label
    name: Label
    approval_id: Label
    state: ApprovalState
    #: The console's validated user who decided; empty while waiting and after a timeout.
    decided_by: Label = ""
    reason: Text = ""
    reason_cut: int = 0
    #: Whether the call runs (approved, or timed out with onTimeout: Allow).
    runs: bool = False


class RunEnded(_Event):
    kind: Literal["run_ended"] = "run_ended"
    outcome: RunOutcome
    error: Text = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0


RunEvent = Annotated[
    RunStarted | MessageRecorded | ModelRequested | ToolCalled | ScriptRan | ApprovalRecorded | MemoryStored
    | RunEnded,
    Field(discriminator="kind"),
]
TimelineEvent = MessageRecorded | ModelRequested | ToolCalled | ScriptRan | ApprovalRecorded


class RunEvents(BaseModel):
    """One message on `console.runs`: some events of one agent's runs, in the order they happened."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    events: Annotated[list[RunEvent], Field(min_length=1, max_length=MAX_EVENTS_PER_MESSAGE)]


class HistoryRequest(BaseModel):
    """An agent asks the console for a session's messages, or one chunk of its working memory (request/reply on
    `console.history`).

    The agent is the sender; `caller` is the principal the session belongs to (who talked to the
    agent). The console answers only from that agent's own runs of that caller and session.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    caller: Label = ""
    max_messages: Annotated[int, Field(ge=1, le=1000)] = 200
    #: Asks for this working-memory chunk (`MemoryStored.key`) instead of the messages.
    memory_key: Annotated[str, Field(max_length=64)] = ""


class HistoryReply(BaseModel):
    """The session's messages (OpenAI chat format, oldest first) from runs recorded in `Full`, and their run ids; or
    the working-memory chunk asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    session_id: str
    messages: list[dict[str, Any]] = Field(default_factory=list)
    run_ids: list[str] = Field(default_factory=list)
    #: The working-memory chunk asked for (None: not kept, expired, or another conversation's), and how many of
    #: its characters were not kept.
    memory: str | None = None
    memory_cut: int = 0
