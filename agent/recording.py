"""What an agent did, recorded without slowing or failing a turn: run events published to the console in the background.

    recorder = RunRecorder(publish=bus_publisher(bus), namespace="team-a", agent="triage", record="Full",
                           redact=secrets_of(config, env))
    async with recorder.run(source="chat", session_id="s1", caller="http", model="gpt") as run:
        ...  # the tool loop; the registry's and the LLM client's observers add to the current run
        run.succeeded(result)

The current run lives in a context variable, so the registry's and the model client's observers
(which know nothing of runs) add their tool calls and model requests to the right run, also when
tools run side by side. Events go into a bounded buffer (`max_buffered`); a background task sends
them in batches. When the buffer is full or the bus fails, events are dropped, counted
(`rockbot_runs_not_recorded_total`) and logged: a turn never waits for the store, and the agent stays
ready (an unreachable console must not take every agent out of its Service).

The Agent's policy (`spec.runs.record`) decides what is kept: `Full`, `Metadata` (no text of
messages, arguments, results or output; their sizes only) or `None` (nothing, not even the run).
Every text is cut at `MAX_TEXT_CHARS` (the characters cut are recorded) and the values of the
agent's secrets (the environment variables its config names) are replaced by `[redacted]` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter

from rockbot.agent.console_requests import ask_console
from rockbot.agent.llm import Attempt
from rockbot.agent.registry import ToolOutcome
from rockbot.bus.topology import CONSOLE_HISTORY, CONSOLE_RUNS
from rockbot.contracts.recording import (
    MAX_BATCH_BYTES,
    MAX_EVENTS_PER_MESSAGE,
    ApprovalRecorded,
    ApprovalState,
    HistoryReply,
    HistoryRequest,
    MemoryStored,
    MessageRecorded,
    ModelRequested,
    RecordMode,
    RunEnded,
    RunEvent,
    RunEvents,
    RunOutcome,
    RunStarted,
    ScriptRan,
    ToolCalled,
    cut,
    new_run_id,
)
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

Publish = Callable[[RunEvents], Awaitable[None]]
REDACTED = "[redacted]"
_MIN_SECRET_CHARS = 6


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


_PROCESS = uuid.uuid4().hex[:16]
_counter = itertools.count()


def _id() -> str:
    """An event's id: unique across processes (a random prefix per process) and cheap (a counter), made per event;
    the console keeps each event once per run, so only the run's own agent writes under it (a run's id is no counter:
    `new_run_id`)."""
    return f"{_PROCESS}-{next(_counter)}"


class Redactor:
    """Replaces each secret value in a text by `[redacted]` (longest first, so no secret is left half-shown)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET_CHARS}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


class Run:
    """One turn being recorded; the recorder's observers add to it, `succeeded`/`failed` say how it ended."""

    def __init__(self, *, recorder: RunRecorder, run_id: str, caller: str = "", session_id: str = "") -> None:
        self.recorder = recorder
        self.run_id = run_id
        #: The conversation the run belongs to (with the agent): where files it brings are kept.
        self.caller = caller
        self.session_id = session_id
        self.outcome: RunOutcome = "Interrupted"
        self.error = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tool_calls = 0

    def messages(self, messages: Iterable[dict[str, Any]]) -> None:
        """Record chat messages (OpenAI format) of this turn, in order."""
        for message in messages:
            content, cut_off = self.recorder.text(message.get("content"))
            calls = [self.recorder.tool_call_message(call) for call in message.get("tool_calls") or []]
            self.recorder.add(MessageRecorded(
                id=_id(), run_id=self.run_id, at=_now(), role=message.get("role", "user"), content=content,
                content_cut=cut_off, tool_calls=calls[:64], tool_call_id=str(message.get("tool_call_id") or "")[:256],
            ))  # fmt: skip

    def ended(self, *, outcome: RunOutcome, error: str = "") -> None:
        self.outcome, self.error = outcome, error

    def approval(self, *, call_id: str, name: str, approval_id: str, state: ApprovalState, decided_by: str = "",
                 reason: str = "", runs: bool = False) -> None:
        """Record a call waiting for a person (`WaitingForApproval`), then how the wait ended."""
        text, cut_off = self.recorder.text(reason)
        self.recorder.add(ApprovalRecorded(
            id=_id(), run_id=self.run_id, at=_now(), call_id=call_id[:256], name=name[:256],
            approval_id=approval_id[:256], state=state, decided_by=decided_by[:256], reason=text, reason_cut=cut_off,
            runs=runs,
        ))  # fmt: skip


_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("rockbot_run", default=None)


def current_run() -> Run | None:
    """The run this code is part of (a tool, a script call), or None outside a recorded turn."""
    return _current.get()


class RunRecorder:
    def __init__(
        self,
        *,
        publish: Publish | None,
        namespace: str,
        agent: str,
        record: RecordMode = "Full",
        retention_days: int = 30,
        redact: Redactor | None = None,
        registry: CollectorRegistry | None = None,
        max_buffered: int = 10_000,
        linger_seconds: float = 0.05,
    ) -> None:
        self.record = record if publish is not None else "None"
        self._namespace = namespace
        self._agent = agent
        self.retention_days = retention_days
        self._publish = publish
        self._redact = redact or Redactor()
        self._buffer: asyncio.Queue[RunEvent] = asyncio.Queue(maxsize=max_buffered)
        self._sender: asyncio.Task[None] | None = None
        self._linger = linger_seconds
        self.not_recorded = Counter(
            "rockbot_runs_not_recorded_total", "Run events dropped before reaching the console, by reason "
            "(buffer_full, bus_error, too_large).", ["reason"], registry=registry,
        )  # fmt: skip

    # -- a turn --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def run(
        self, *, source: str, session_id: str, caller: str, model: str, request_id: str = "",
        parent_run_id: str | None = None, run_id: str | None = None,
    ) -> AsyncIterator[Run]:  # fmt: skip
        """Record one turn: its start now, its end (and outcome) when the block leaves; the block's code is its run.
        `run_id`: one of this agent's (`new_run_id`) chosen before the turn, as an A2A turn's files name it."""
        run = Run(recorder=self, run_id=run_id or new_run_id(namespace=self._namespace, agent=self._agent),
                  caller=caller[:256], session_id=session_id[:256])
        if self.record == "None":
            yield run
            return
        context = trace.get_current_span().get_span_context()
        self.add(RunStarted(
            id=_id(), run_id=run.run_id, at=_now(), source=source, session_id=session_id[:256], caller=caller[:256],
            parent_run_id=parent_run_id, request_id=request_id[:256], model=model[:256], record=self.record,
            retention_days=self.retention_days, trace_id=f"{context.trace_id:032x}" if context.is_valid else "",
        ))  # fmt: skip
        token = _current.set(run)
        try:
            yield run
        except asyncio.CancelledError:
            run.ended(outcome="Interrupted", error="the turn was cancelled (the caller left or the agent stopped)")
            raise
        except Exception as exc:
            if run.outcome == "Interrupted":
                run.ended(outcome="Failed", error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            _current.reset(token)
            error, _ = self.text(run.error)
            self.add(RunEnded(
                id=_id(), run_id=run.run_id, at=_now(), outcome=run.outcome, error=error,
                prompt_tokens=run.prompt_tokens, completion_tokens=run.completion_tokens, tool_calls=run.tool_calls,
            ))  # fmt: skip

    # -- observers (the registry's and the model client's) --------------------------------------

    def observe_tool(self, outcome: ToolOutcome) -> None:
        run = _current.get()
        if run is None:
            return
        run.tool_calls += 1
        arguments, arguments_cut = self.text(outcome.arguments)
        result, result_cut = self.text(outcome.content if outcome.error is None else outcome.error.message)
        self.add(ToolCalled(
            id=_id(), run_id=run.run_id, at=_now(), call_id=outcome.tool_call_id[:256], name=outcome.name[:256],
            source=outcome.source[:256], arguments=arguments, arguments_cut=arguments_cut, result=result,
            result_cut=result_cut, error_code="" if outcome.error is None else outcome.error.code.value,
            duration_seconds=outcome.duration_seconds,
        ))  # fmt: skip

    def observe_llm(self, attempt: Attempt) -> None:
        run = _current.get()
        if run is None:
            return
        usage = attempt.usage
        if usage is not None:
            run.prompt_tokens += usage.prompt_tokens
            run.completion_tokens += usage.completion_tokens
        self.add(ModelRequested(
            id=_id(), run_id=run.run_id, at=_now(), model=attempt.model[:256], status=attempt.status[:256],
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            latency_seconds=attempt.seconds, finish_reason=(attempt.finish_reason or "")[:256],
        ))  # fmt: skip

    def observe_script(
        self, *, call_id: str, exit_code: int | None, stdout: str, stderr: str, duration_seconds: float,
        backend: str = "", pod: str = "",
    ) -> None:  # fmt: skip
        """A script's run, from the sandbox client (its output, exit code, where it ran)."""
        run = _current.get()
        if run is None:
            return
        out, out_cut = self.text(stdout)
        err, err_cut = self.text(stderr)
        self.add(ScriptRan(
            id=_id(), run_id=run.run_id, at=_now(), call_id=call_id[:256], exit_code=exit_code, stdout=out,
            stdout_cut=out_cut, stderr=err, stderr_cut=err_cut, duration_seconds=duration_seconds,
            backend=backend[:256], pod=pod[:256],
        ))  # fmt: skip

    def observe_memory(self, *, session_id: str, key: str, value: str, ttl_seconds: float) -> None:
        """A working-memory chunk the turn stored: kept under the run's conversation for its later turns on any
        replica (a `Full` run's only: a chunk is all text)."""
        run = _current.get()
        if run is None or self.record != "Full":
            return
        content, content_cut = self.text(value)
        self.add(MemoryStored(id=_id(), run_id=run.run_id, at=_now(), key=key[:64], content=content,
                              content_cut=content_cut, ttl_seconds=max(1, min(int(ttl_seconds), 86_400))))  # fmt: skip

    # -- plumbing -------------------------------------------------------------------------------

    def text(self, value: object) -> tuple[str, int]:
        """A text as this policy keeps it: redacted and cut (Metadata: nothing, its length counted as cut)."""
        text = value if isinstance(value, str) else ("" if value is None else str(value))
        if self.record != "Full":
            return "", len(text)
        return cut(self._redact(text))

    def tool_call_message(self, call: dict[str, Any]) -> dict[str, Any]:
        function = call.get("function") or {}
        arguments, _ = self.text(function.get("arguments"))
        return {"id": str(call.get("id") or "")[:256], "type": "function",
                "function": {"name": str(function.get("name") or "")[:256], "arguments": arguments}}  # fmt: skip

    def add(self, event: RunEvent) -> None:
        """Queue an event for sending; never waits (a full buffer drops it, counted)."""
        if self._publish is None:
            return
        try:
            self._buffer.put_nowait(event)
        except asyncio.QueueFull:
            self.not_recorded.labels("buffer_full").inc()

    async def start(self) -> None:
        if self._publish is not None and self._sender is None:
            self._sender = asyncio.create_task(self._send_forever(), name="run recorder")

    async def close(self, *, flush_seconds: float = 2.0) -> None:
        """Send what is buffered (for up to `flush_seconds`), then stop."""
        if self._sender is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_seconds):
                await self._buffer.join()
        await cancel_and_wait(self._sender)
        self._sender = None

    async def _send_forever(self) -> None:
        """Batches of what a moment brings, each within the console's limits (events and bytes per message: working
        memory chunks are large), else the console would refuse the whole message unread."""
        assert self._publish is not None
        carried: RunEvent | None = None  # taken from the buffer, but the next message's first
        while True:
            first, carried = carried or await self._buffer.get(), None
            size = _size(first)
            if size > _MESSAGE_BYTES:
                self.not_recorded.labels("too_large").inc()
                self._buffer.task_done()
                continue
            events = [first]
            await asyncio.sleep(self._linger)
            while len(events) < MAX_EVENTS_PER_MESSAGE and not self._buffer.empty():
                event = self._buffer.get_nowait()
                size += _size(event)
                if size > _MESSAGE_BYTES:
                    carried = event
                    break
                events.append(event)
            try:
                await self._publish(RunEvents(events=events))
            except Exception as exc:  # whatever the bus says, the turn must not notice
                self.not_recorded.labels("bus_error").inc(len(events))
                log.warning("%d run events not recorded: %s", len(events), exc)
            finally:
                for _ in events:
                    self._buffer.task_done()


#: The most bytes of events one message carries, leaving room for the message's own fields within `MAX_BATCH_BYTES`.
_MESSAGE_BYTES = MAX_BATCH_BYTES - 4096


def _size(event: RunEvent) -> int:
    return len(event.__pydantic_serializer__.to_json(event))


class HistorySource(Protocol):
    """Where a runtime reads a session's recorded history and working memory: the console over the bus, or
    `rockbot local`'s store."""

    async def fetch(self, *, caller: str, session_id: str, max_messages: int) -> HistoryReply | None: ...

    async def memory(self, *, caller: str, session_id: str, key: str) -> HistoryReply | None: ...


class SessionHistory:
    """A session's history and working memory as the console recorded them (every replica's turns, across restarts),
    asked over the bus with a short timeout; None when it cannot say (the turn then goes on with what this process
    holds)."""

    def __init__(
        self, *, bus: Any, timeout_seconds: float = 2.0, quiet_seconds: float = 60.0
    ) -> None:
        self._bus = bus
        self._timeout = timeout_seconds
        self._quiet = quiet_seconds
        self._asleep_until = 0.0

    async def fetch(self, *, caller: str, session_id: str, max_messages: int) -> HistoryReply | None:
        """The recorded history."""
        return await self._ask(HistoryRequest(session_id=session_id[:256], caller=caller[:256],
                                              max_messages=min(max_messages, 1000)))  # fmt: skip

    async def memory(self, *, caller: str, session_id: str, key: str) -> HistoryReply | None:
        """The recorded working-memory chunk `key` of the session (in `memory`)."""
        return await self._ask(HistoryRequest(session_id=session_id[:256], caller=caller[:256], memory_key=key[:64]))

    async def _ask(self, request: HistoryRequest) -> HistoryReply | None:
        """The console's answer; None at once for `quiet_seconds` after it did not answer (no wait per turn while it
        is down or not installed)."""
        now = asyncio.get_running_loop().time()
        if now < self._asleep_until:
            return None
        try:
            return await ask_console(self._bus, queue=CONSOLE_HISTORY, body=request, answer=HistoryReply,
                                     kind="history", timeout_seconds=self._timeout)  # fmt: skip
        except Exception as exc:  # no history from the store is never a failed turn
            self._asleep_until = now + self._quiet
            log.info("no recorded history for this session (%s); going on with this process's", exc)
            return None


def bus_publisher(bus: Any) -> Publish:
    """Publish run events on `console.runs` as this agent (the console takes the agent from the login)."""

    async def publish(events: RunEvents) -> None:
        await bus.publish(queue=CONSOLE_RUNS, body=events)

    return publish


def secrets_of(config: Any, env: dict[str, str]) -> Redactor:
    """A redactor of the values of every environment variable the agent's config names (its Secrets' keys)."""
    named = config.model_dump_json()
    return Redactor(value for key, value in env.items() if f'"{key}"' in named)
