"""Replay a recorded run against its Agent as it is now, and compare the two runs (`rockbot replay`, the run page).

The console sends the run's input (its first user message) to the agent's inbox again, as a turn of the person
replaying (`on_behalf_of`, in a fresh session: the replay is nobody's conversation), with `Replay`: `live` runs
the tools; `recorded` carries the run's tool calls and results, and the agent answers each call of the same name and
arguments with its recorded result and runs nothing (`agent/replaying.py`), so only the model is exercised. The
agent takes a replay only from `service.console` (the broker checks the sender): anyone else could make it believe
forged tool results. The replayed run is recorded as any run, source `replay`, its parent the run replayed, and
compared field by field: the answer, the tool calls with their arguments, the tokens and the latency.

Only a run recorded in `Full` replays (a `Metadata` run kept no input or results). The prior turns of the run's
session are not sent: the replay is the run's own turn, on its own.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rockbot.console.chat import ChatFailed, ChatRelay
from rockbot.console.store import Store
from rockbot.console.store_models import RunDetail
from rockbot.contracts.inbox import MAX_REPLAYED_CALLS, NOT_REPLAYED, InboxReply, RecordedCall, Replay

Mode = Literal["live", "recorded"]
#: How long the console waits for the replayed run's end to reach the store after the agent answered.
RECORDED_WITHIN_SECONDS = 30.0
#: The most bytes of recorded tool calls one replay carries (the inbox takes 1 MiB in all).
MAX_RECORDED_BYTES = 900 * 1024
#: Where `rockbot local`'s console gives a program at the machine its CSRF token (`rockbot replay` without --token).
CSRF_PATH = "/api/local/csrf"


class ReplayRefused(ValueError):
    """The run cannot be replayed (not recorded in full, still running, too large); the message says why."""


class ReplayOptions(BaseModel):
    """What `POST /api/runs/{run_id}/replay` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = "recorded"
    model: str | None = Field(default=None, min_length=1, max_length=256)
    system_prompt: str | None = Field(default=None, max_length=64 * 1024)


class ToolCallSide(BaseModel):
    name: str
    arguments: str
    #: `ok`, or the call's error code.
    status: str
    result: str = ""
    #: A recorded replay's call that matched no recorded one (answered as not run).
    not_run: bool = False


class RunSide(BaseModel):
    """One run as the comparison shows it."""

    run_id: str
    model: str
    outcome: str | None
    answer: str
    tool_calls: list[ToolCallSide]
    prompt_tokens: int
    completion_tokens: int
    latency_seconds: float | None


class Comparison(BaseModel):
    """A run and its replay, side by side."""

    mode: Mode
    original: RunSide
    replay: RunSide

    @property
    def differences(self) -> list[str]:
        """What differs, one line each (empty: the replay did the same)."""
        found = []
        if self.original.answer != self.replay.answer:
            found.append("answer")
        calls = self.original.tool_calls, self.replay.tool_calls
        for index in range(max(len(calls[0]), len(calls[1]))):
            before, after = (c[index] if index < len(c) else None for c in calls)
            if before is None or after is None or (before.name, _flat(before.arguments)) != (
                    after.name, _flat(after.arguments)) or after.not_run:
                found.append(f"tool call {index + 1}")
        return found


def side(run: RunDetail) -> RunSide:
    calls = [ToolCallSide(name=e.name, arguments=str(e.data.get("arguments") or ""), status=e.status,
                          result=str(e.data.get("result") or ""),
                          not_run=e.status != "ok" and str(e.data.get("result") or "").startswith(NOT_REPLAYED))
             for e in run.timeline if e.kind == "tool_call"]  # fmt: skip
    answers = [e for e in run.timeline
               if e.kind == "message" and e.name == "assistant" and not e.data.get("tool_calls")]
    latency = (run.ended_at - run.started_at).total_seconds() if run.ended_at else None
    return RunSide(run_id=run.run_id, model=run.model, outcome=run.outcome,
                   answer=str(answers[-1].data.get("content") or "") if answers else "", tool_calls=calls,
                   prompt_tokens=run.prompt_tokens, completion_tokens=run.completion_tokens,
                   latency_seconds=latency)  # fmt: skip


def replay_of(run: RunDetail, options: ReplayOptions) -> tuple[str, Replay]:
    """The run's input and the `Replay` that asks the agent to run it again; `ReplayRefused` when it cannot."""
    if run.record != "Full":
        raise ReplayRefused(f"run {run.run_id} was recorded with {run.record}: it kept no input or tool results to "
                            "replay (set the Agent's spec.runs.record: Full)")
    if run.outcome is None:
        raise ReplayRefused(f"run {run.run_id} has not ended (or its end was never recorded): replay it once it has")
    inputs = [e for e in run.timeline if e.kind == "message" and e.name == "user" and e.data.get("content")]
    if not inputs:
        raise ReplayRefused(f"run {run.run_id} recorded no user message to send again")
    recorded = None
    if options.mode == "recorded":
        recorded = [RecordedCall(name=e.name, arguments=str(e.data.get("arguments") or ""),
                                 result=str(e.data.get("result") or ""),
                                 error_code="" if e.status == "ok" else e.status)
                    for e in run.timeline if e.kind == "tool_call"]  # fmt: skip
        if len(recorded) > MAX_REPLAYED_CALLS:
            raise ReplayRefused(f"run {run.run_id} made {len(recorded)} tool calls; a recorded replay carries at most "
                                f"{MAX_REPLAYED_CALLS}: replay it with mode live")
        size = sum(len(c.arguments) + len(c.result) for c in recorded)
        if size > MAX_RECORDED_BYTES:
            raise ReplayRefused(f"run {run.run_id}'s tool calls hold {size} characters, more than a recorded replay "
                                f"carries ({MAX_RECORDED_BYTES}): replay it with mode live")
    replay = Replay(of_run=run.run_id, recorded=recorded, model=options.model, system_prompt=options.system_prompt)
    return str(inputs[0].data["content"]), replay


class Replayer:
    """Replays runs through the console's chat relay (its bus login) and reads the replays back from the store."""

    def __init__(self, *, relay: ChatRelay, store: Store) -> None:
        self._relay = relay
        self._store = store

    async def replay(self, run: RunDetail, *, user: str, options: ReplayOptions) -> Comparison:
        """Run `run` again as `user`'s turn and compare; `ReplayRefused` or `ChatFailed` when it cannot."""
        content, replay = replay_of(run, options)
        reply: InboxReply | None = None
        async for step in self._relay.turn(namespace=run.namespace, agent=run.agent, user=user,
                                           session_id=f"replay-{uuid.uuid4().hex[:16]}", content=content,
                                           replay=replay):  # fmt: skip
            if isinstance(step, InboxReply):
                reply = step
        assert reply is not None  # the relay's last step
        if reply.error is not None:
            raise ChatFailed(f"{run.namespace}/{run.agent} did not replay run {run.run_id}: {reply.error.message}")
        if reply.run_id is None:
            raise ChatFailed(f"{run.namespace}/{run.agent} replayed run {run.run_id} without recording it (its "
                             "spec.runs.record is None now): nothing to compare")
        replayed = await self._ended(reply.run_id)
        return Comparison(mode=options.mode, original=side(run), replay=side(replayed))

    async def _ended(self, run_id: str) -> RunDetail:
        """The replayed run once its end is in the store (the agent records in the background)."""
        async with asyncio.timeout(RECORDED_WITHIN_SECONDS):
            while True:
                found = await self._store.get_run(run_id)
                if found is not None and found.outcome is not None:
                    return found
                await asyncio.sleep(0.1)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str, width: int) -> str:
    flat = _flat(text)
    return (flat if len(flat) <= width else flat[: width - 1] + "…").ljust(width)


def side_by_side(comparison: Comparison, *, width: int = 56) -> str:
    """The two runs in two columns, a `|` between the cells that differ (as `diff -y`), then what differs."""
    before, after = comparison.original, comparison.replay
    rows: list[tuple[str, str, str]] = [
        ("run", before.run_id, after.run_id),
        ("model", before.model, after.model),
        ("outcome", before.outcome or "running", after.outcome or "running"),
    ]
    for index in range(max(len(before.tool_calls), len(after.tool_calls))):
        cells = []
        for calls in (before.tool_calls, after.tool_calls):
            call = calls[index] if index < len(calls) else None
            cells.append("-" if call is None else f"{call.name}({_flat(call.arguments)})"
                         + (" NOT RUN" if call.not_run else
                            "" if call.status == "ok" else f" -> {call.status}"))  # fmt: skip
        rows.append((f"tool {index + 1}", cells[0], cells[1]))
    rows += [
        ("answer", before.answer, after.answer),
        ("tokens", f"{before.prompt_tokens} in / {before.completion_tokens} out",
         f"{after.prompt_tokens} in / {after.completion_tokens} out"),
        ("latency", _seconds(before.latency_seconds), _seconds(after.latency_seconds)),
    ]
    lines = [f"{'':9} {'original':{width}}   replay ({comparison.mode})"]
    for label, left, right in rows:
        mark = " " if _flat(left) == _flat(right) or label in ("run",) else "|"
        lines.append(f"{label:9} {_cell(left, width)} {mark} {_cell(right, width).rstrip()}")
    found = comparison.differences
    lines.append("differs:  " + (", ".join(found) if found else "nothing in the answer or the tool calls"))
    if any(call.not_run for call in after.tool_calls):
        lines.append("NOT RUN:  the recorded run made no such call, so the replay answered it as not run")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
