"""Run events as an agent would send them, for the console's tests and benchmarks."""

from __future__ import annotations

import datetime
import itertools
import uuid

from rockbot.contracts.recording import (
    MessageRecorded,
    ModelRequested,
    RunEnded,
    RunEvent,
    RunStarted,
    ScriptRan,
    ToolCalled,
    new_run_id,
)

_ids = itertools.count()


def event_id() -> str:
    return f"e{next(_ids)}-{uuid.uuid4().hex[:8]}"


def typical_run(
    *,
    run_id: str | None = None,
    namespace: str = "team-a",
    agent: str = "triage",
    at: datetime.datetime | None = None,
    session_id: str = "s1",
    caller: str = "http",
    source: str = "chat",
    tools: int = 3,
    outcome: str = "Succeeded",
    retention_days: int = 30,
    record: str = "Full",
    question: str = "What is 6 x 7?",
    answer: str = "42",
) -> list[RunEvent]:
    """A turn of the agent `namespace/agent` (its run id one of the agent's own, unless given): the user's message, a
    model request with `tools` tool calls (one a script), their results, the answer."""
    run_id = run_id or new_run_id(namespace=namespace, agent=agent)
    at = at or datetime.datetime.now(datetime.UTC)
    step = datetime.timedelta(milliseconds=1)
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": f"tool_{i}", "arguments": '{"x": 1}'}}
             for i in range(tools)]  # fmt: skip
    events: list[RunEvent] = [
        RunStarted(id=event_id(), run_id=run_id, at=at, source=source, session_id=session_id, caller=caller,
                   model="m", record=record, retention_days=retention_days),
        MessageRecorded(id=event_id(), run_id=run_id, at=at + step, role="user", content=question),
        ModelRequested(id=event_id(), run_id=run_id, at=at + 2 * step, model="m", status="200", prompt_tokens=120,
                       completion_tokens=30, latency_seconds=0.4, finish_reason="tool_calls"),
        MessageRecorded(id=event_id(), run_id=run_id, at=at + 3 * step, role="assistant", tool_calls=calls),
    ]  # fmt: skip
    for i in range(tools):
        events.append(ToolCalled(id=event_id(), run_id=run_id, at=at + (4 + i) * step, call_id=f"c{i}",
                                 name=f"tool_{i}", source="builtin", arguments='{"x": 1}', result=f"result {i}",
                                 duration_seconds=0.01))  # fmt: skip
        if i == 0:
            events.append(ScriptRan(id=event_id(), run_id=run_id, at=at + (4 + i) * step, call_id="c0", exit_code=0,
                                    stdout="hello\n", backend="pods", pod="script-abc", duration_seconds=0.9))
        events.append(MessageRecorded(id=event_id(), run_id=run_id, at=at + (4 + i) * step, role="tool",
                                      tool_call_id=f"c{i}", content=f"result {i}"))  # fmt: skip
    end = at + (10 + tools) * step
    events += [
        ModelRequested(id=event_id(), run_id=run_id, at=end, model="m", status="200", prompt_tokens=200,
                       completion_tokens=10, latency_seconds=0.3, finish_reason="stop"),
        MessageRecorded(id=event_id(), run_id=run_id, at=end, role="assistant", content=answer),
        RunEnded(id=event_id(), run_id=run_id, at=end + step, outcome=outcome, prompt_tokens=320,
                 completion_tokens=40, tool_calls=tools),
    ]  # fmt: skip
    return events
