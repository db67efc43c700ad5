"""The `subagents` set: short-lived helpers in this process, and the whiteboard they share with you.

`spawn_subagent(instruction, tools?)` starts a helper: a fresh tool loop with the same model, its
own short history, and a subset of the parent's tools (all of them by default, never the spawn
tools themselves, so helpers cannot multiply). It runs as a task beside the parent; its final
answer lands on the whiteboard under `helper:<id>` and in `list_subagents()`. With
`wait_seconds` the parent waits that long for the answer, which is how several helpers run side
by side: spawn them in one round of parallel tool calls.

The whiteboard is a small key-value store per conversation (session): the parent and its helpers
read and write it to hand over results. Bounds: `MAX_HELPERS_RUNNING` per session,
`MAX_WHITEBOARD_KEYS` keys and `MAX_WHITEBOARD_VALUE` characters per value. An agent lives long
and serves many sessions, so what is finished is forgotten, oldest first: at most
`MAX_HELPERS_KEPT` finished helpers and `MAX_WHITEBOARDS` whiteboards (the least recently used
goes; one whose session still has a helper running is kept).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from rockbot.agent.defining import tool
from rockbot.agent.registry import ToolContext, ToolFailure, ToolRegistry
from rockbot.agent.toolsets.kit import Guide, ToolKit, catalogue_description
from rockbot.contracts.errors import ErrorCode

MAX_HELPERS_RUNNING = 4
MAX_WHITEBOARD_KEYS = 256
MAX_WHITEBOARD_VALUE = 64_000
MAX_HELPERS_KEPT = 256
MAX_WHITEBOARDS = 256
SPAWN_TOOLS = frozenset({"spawn_subagent", "list_subagents", "cancel_subagent"})

GUIDE = Guide(
    name="subagents",
    summary="Splitting work between short-lived helpers and sharing results on the whiteboard.",
    document=(
        "# Helpers and the whiteboard\n\n"
        "- `spawn_subagent(instruction, tools, wait_seconds)` starts a helper with a complete, "
        "self-contained instruction (it does not see your conversation) and, optionally, the names of "
        "the tools it may use. To run several at once, spawn them in the same round of tool calls.\n"
        "- The helper's final answer is written to the whiteboard under `helper:<id>`; "
        "`list_subagents()` shows every helper's state.\n"
        "- `whiteboard_write(key, value)` / `whiteboard_read(key)` share data with helpers; "
        "`whiteboard_read()` without a key lists the keys.\n"
        "- `cancel_subagent(id)` stops a helper that is no longer needed.\n"
    ),
)


class Helper(BaseModel):
    model_config = {"arbitrary_types_allowed": True}

    id: str
    session_id: str
    instruction: str
    state: Literal["running", "done", "failed", "cancelled"] = "running"
    answer: str = ""
    task: asyncio.Task[None] | None = Field(default=None, exclude=True)


class Roster:
    """The helpers of every session, forgetting the oldest finished ones beyond `max_kept`."""

    def __init__(self, *, max_kept: int = MAX_HELPERS_KEPT) -> None:
        self._helpers: dict[str, Helper] = {}
        self._max_kept = max_kept

    def add(self, helper: Helper) -> None:
        self._helpers[helper.id] = helper
        self.forget_finished()

    def get(self, helper_id: str) -> Helper | None:
        return self._helpers.get(helper_id)

    def of_session(self, session_id: str) -> list[Helper]:
        return [h for h in self._helpers.values() if h.session_id == session_id]

    def all(self) -> list[Helper]:
        return list(self._helpers.values())

    def running_sessions(self) -> set[str]:
        return {h.session_id for h in self._helpers.values() if h.state == "running"}

    def forget_finished(self) -> None:
        finished = [h.id for h in self._helpers.values() if h.state != "running"]
        for helper_id in finished[: max(0, len(finished) - self._max_kept)]:
            del self._helpers[helper_id]


class Whiteboards:
    """One key-value board per session, at most `max_boards`, least recently used evicted first."""

    def __init__(self, *, max_boards: int = MAX_WHITEBOARDS, busy: Callable[[], set[str]] = set) -> None:
        self._boards: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._max_boards = max_boards
        self._busy = busy  # sessions whose boards must stay (a helper will write its answer there)

    def write(self, *, session_id: str, key: str, value: str) -> None:
        board = self._boards.setdefault(session_id, {})
        self._boards.move_to_end(session_id)
        if key not in board and len(board) >= MAX_WHITEBOARD_KEYS:
            raise ToolFailure(
                f"the whiteboard is full ({MAX_WHITEBOARD_KEYS} keys); overwrite an existing key instead",
                code=ErrorCode.REJECTED,
            )
        board[key] = value[:MAX_WHITEBOARD_VALUE]
        self._evict()

    def read(self, *, session_id: str, key: str) -> str | None:
        return self._touched(session_id).get(key)

    def keys(self, *, session_id: str) -> list[str]:
        return list(self._touched(session_id))

    def sessions(self) -> list[str]:
        return list(self._boards)

    def _touched(self, session_id: str) -> dict[str, str]:
        if session_id not in self._boards:
            return {}
        self._boards.move_to_end(session_id)
        return self._boards[session_id]

    def _evict(self) -> None:
        excess = len(self._boards) - self._max_boards
        if excess <= 0:
            return
        busy = self._busy()
        for session_id in [s for s in self._boards if s not in busy][:excess]:
            del self._boards[session_id]


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    if kit.run_helper is None:
        raise ValueError("the subagents tool set needs the runtime's helper runner")
    run_helper = kit.run_helper
    helpers = Roster()
    boards = Whiteboards(busy=helpers.running_sessions)
    numbers = itertools.count(1)

    @tool(name="spawn_subagent", description=catalogue_description("spawn_subagent"), timeout=660)
    async def spawn_subagent(
        instruction: Annotated[str, Field(min_length=1, description="A complete, self-contained task.")],
        context: ToolContext,
        tools: Annotated[
            list[str] | None, Field(description="Names of your tools the helper may use (default: all).")
        ] = None,
        wait_seconds: Annotated[
            float, Field(ge=0, le=600, description="Wait this long for the answer (0: return at once).")
        ] = 0,
    ) -> str:
        running = [h for h in helpers.of_session(context.session_id) if h.state == "running"]
        if len(running) >= MAX_HELPERS_RUNNING:
            raise ToolFailure(
                f"{len(running)} helpers are already running (the limit is {MAX_HELPERS_RUNNING}); wait for one "
                "to finish or cancel one",
                code=ErrorCode.REJECTED,
                retryable=True,
            )
        wanted = tools if tools is not None else [t.name for t in registry.list()]
        allowed = [name for name in wanted if name not in SPAWN_TOOLS]
        unknown = [n for n in allowed if n not in registry]
        barred = [n for n in allowed if registry.is_blacklisted(n)] if tools is not None else []
        if unknown or barred:
            problems = [f"unknown tools for the helper: {', '.join(unknown)}"] if unknown else []
            if barred:
                problems.append(f"blacklisted for this agent, so not for its helpers either: {', '.join(barred)}")
            raise ToolFailure("; ".join(problems), code=ErrorCode.INVALID_ARGUMENTS)
        helper = Helper(id=f"h{next(numbers)}", session_id=context.session_id, instruction=instruction)
        helpers.add(helper)

        async def work() -> None:
            try:
                helper.answer = await run_helper(
                    instruction=instruction,
                    registry=registry.subset(allowed),
                    session_id=context.session_id,
                    call_chain=context.call_chain,
                )
                helper.state = "done"
            except Exception as exc:
                helper.state, helper.answer = "failed", f"{type(exc).__name__}: {exc}"
            boards.write(session_id=context.session_id, key=f"helper:{helper.id}", value=helper.answer)

        def settled(task: asyncio.Task[None]) -> None:
            if task.cancelled():  # also when cancelled before it ever ran
                helper.state = "cancelled"
            helpers.forget_finished()

        helper.task = asyncio.create_task(work(), name=f"helper {helper.id}")
        helper.task.add_done_callback(settled)
        if wait_seconds:
            done, _ = await asyncio.wait({helper.task}, timeout=wait_seconds)
            if done:
                return f"Helper {helper.id} {helper.state}: {helper.answer}"
        return (
            f"Helper {helper.id} started. Its answer will be on the whiteboard under 'helper:{helper.id}'; "
            "check list_subagents() for its state."
        )

    @tool(name="list_subagents", description=catalogue_description("list_subagents"))
    async def list_subagents(context: ToolContext) -> str:
        mine = helpers.of_session(context.session_id)
        if not mine:
            return "You have started no helpers."
        rows = [f"| {h.id} | {h.state} | {_cell(h.instruction, 60)} | {_cell(h.answer, 120)} |" for h in mine]
        return "\n".join(["| id | state | instruction | answer |", "|---|---|---|---|", *rows])

    @tool(name="cancel_subagent", description=catalogue_description("cancel_subagent"))
    async def cancel_subagent(
        id: Annotated[str, Field(description="The helper's id, e.g. h1.")], context: ToolContext
    ) -> str:
        helper = helpers.get(id)
        if helper is None or helper.session_id != context.session_id:
            raise ToolFailure(f"no helper {id!r} in this conversation", code=ErrorCode.INVALID_ARGUMENTS)
        if helper.state != "running" or helper.task is None:
            return f"Helper {id} already {helper.state}."
        helper.task.cancel()
        await asyncio.gather(helper.task, return_exceptions=True)
        return f"Helper {id} cancelled."

    @tool(name="whiteboard_write", description=catalogue_description("whiteboard_write"))
    async def whiteboard_write(
        key: Annotated[str, Field(min_length=1, max_length=200)], value: str, context: ToolContext
    ) -> str:
        boards.write(session_id=context.session_id, key=key, value=value)
        return f"Wrote {len(value)} characters under {key!r}."

    @tool(name="whiteboard_read", description=catalogue_description("whiteboard_read"))
    async def whiteboard_read(
        context: ToolContext,
        key: Annotated[str | None, Field(description="The key to read; leave out to list the keys.")] = None,
    ) -> str:
        if key is None:
            keys = boards.keys(session_id=context.session_id)
            return "Keys: " + ", ".join(keys) if keys else "The whiteboard is empty."
        value = boards.read(session_id=context.session_id, key=key)
        if value is None:
            raise ToolFailure(f"nothing on the whiteboard under {key!r}", code=ErrorCode.INVALID_ARGUMENTS)
        return value

    async def cancel_all() -> None:
        tasks = [h.task for h in helpers.all() if h.task is not None and not h.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    kit.closers.append(cancel_all)
    for built in (spawn_subagent, list_subagents, cancel_subagent, whiteboard_write, whiteboard_read):
        registry.register(built)
    kit.guides.add(GUIDE)


def _cell(text: str, limit: int) -> str:
    """Text as one Markdown table cell: on one line, its pipes escaped, at most `limit` characters of it."""
    return " ".join(text[:limit].split()).replace("|", "\\|")
