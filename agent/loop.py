"""The tool-calling loop: ask the model, run the tools it calls, answer each call, ask again.

One round sends the system prompt, the history and the offered tools; text deltas stream to the
caller. When the model calls tools they run (side by side when there are several and parallel
calls are on, at most `max_parallel` at once; else one after another, in the model's order) and
each call gets exactly one `role: tool` message with its `tool_call_id`, in the order the calls
were made, so any provider accepts the next request. Unknown and blacklisted tools are answered
with an error without running anything (the registry decides). A result longer than
`max_result_chars` is split into working memory and the model gets an index of keys; the reader
`get_from_working_memory` is installed then if the `memory` set did not already offer it, so any
tool's large result can be read back; and so it is before a turn whose history holds such an index
(written by another replica or an earlier pod: the chunks are the run store's). Only if the reader
is blacklisted is the result cut with a notice. The loop ends with the first answer without tool
calls (one the model cut at its output token limit says so at its end), or
after `max_iterations` rounds with a final message saying so.

Before each model request the loop asks `admit` (the daily token budget): refused before the first,
the turn fails with `BudgetExhausted`; refused later, the turn ends with a final message saying so,
after the tools that already ran. The result counts the tokens of the loop's model requests.

A call that needs a person's approval asks `approvals` first (see `approvals.py`); refused, its error is
the call's answer and the tool does not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rockbot.agent.approvals import ApprovalGate
from rockbot.agent.budget import BudgetExhausted
from rockbot.agent.events import EventSink, TextDelta, ToolFinished, ToolStarted, emit
from rockbot.agent.llm import LlmClient, ToolCall, Usage
from rockbot.agent.memory import WorkingMemory, is_index
from rockbot.agent.registry import ToolContext, ToolOutcome, ToolRegistry
from rockbot.agent.replaying import RecordedTools
from rockbot.agent.toolsets.memory import reader
from rockbot.contracts.inbox import Replay

Message = dict[str, Any]
CUT_OFF = "\n\n[the answer was cut off: the model reached its output token limit (finish_reason: length)]"
READER = "get_from_working_memory"
#: Asked before each model request; raises `BudgetExhausted` when the request may not go out.
Admission = Callable[[], Awaitable[None]]


class LoopSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_iterations: int = Field(default=10, ge=1)
    parallel_tool_calls: bool = True
    max_parallel: int = Field(default=8, ge=1)
    max_result_chars: int = Field(default=16_000, ge=100)
    stream: bool = True


class LoopResult(BaseModel):
    answer: str
    tools_called: list[str] = Field(default_factory=list)
    iterations: int
    hit_iteration_limit: bool = False
    budget_exhausted: bool = False
    #: What the loop's model requests used, summed over its rounds.
    usage: Usage = Field(default_factory=Usage)
    #: The turn's run in the run store, when it was recorded (set by the runtime).
    run_id: str | None = None


class ToolLoop:
    def __init__(
        self,
        *,
        llm: LlmClient,
        registry: ToolRegistry,
        memory: WorkingMemory,
        settings: LoopSettings,
        system_prompt: str = "",
        admit: Admission | None = None,
        approvals: ApprovalGate | None = None,
    ):
        self.llm = llm
        self.registry = registry
        self.memory = memory
        self.settings = settings
        self.system_prompt = system_prompt
        self.admit = admit
        self.approvals = approvals

    async def run(
        self,
        *,
        history: list[Message],
        session_id: str,
        call_chain: tuple[str, ...] = (),
        on_event: EventSink | None = None,
        replay: Replay | None = None,
    ) -> LoopResult:
        """Run until a final answer; `history` (without the system prompt) is extended in place. `replay`: this turn
        replays a recorded run (its model, its system prompt, its recorded tool results instead of running tools)."""

        wrote = {"before": False, "this round": False}  # text streamed in an earlier round / in this one

        async def on_text(text: str) -> None:
            if wrote["before"] and not wrote["this round"]:
                await emit(on_event, TextDelta(text="\n\n"))  # what the model said before its tool calls stays apart
            wrote["this round"] = True
            await emit(on_event, TextDelta(text=text))

        if any(is_index(message) for message in history):
            self._offer_reader()
        called: list[str] = []
        usage = Usage()
        system_prompt = self.system_prompt if replay is None or replay.system_prompt is None else replay.system_prompt
        prefix = [{"role": "system", "content": system_prompt}] if system_prompt else []
        model = replay.model if replay is not None else None
        recorded = RecordedTools(replay.recorded) if replay is not None and replay.recorded is not None else None
        for iteration in range(1, self.settings.max_iterations + 1):
            wrote["before"] = wrote["before"] or wrote["this round"]
            wrote["this round"] = False
            try:
                if self.admit is not None:
                    await self.admit()
            except BudgetExhausted as exhausted:
                if iteration == 1:
                    raise
                answer = f"I stopped before finishing: {exhausted}."
                history.append({"role": "assistant", "content": answer})
                await on_text(answer)
                return LoopResult(answer=answer, tools_called=called, iterations=iteration - 1,
                                  budget_exhausted=True, usage=usage)
            completion = await self.llm.complete(
                messages=prefix + history,
                tools=self.registry.openai_tools() or None,
                stream=self.settings.stream,
                on_text=on_text,
                model=model,
            )
            usage += completion.usage
            if completion.cut_off and not completion.tool_calls:
                completion.content += CUT_OFF
                await on_text(CUT_OFF)
            history.append(completion.message())
            if not completion.tool_calls:
                return LoopResult(answer=completion.content, tools_called=called, iterations=iteration, usage=usage)
            outcomes = await self._run_tools(
                completion.tool_calls, session_id=session_id, call_chain=call_chain, on_event=on_event,
                recorded=recorded,
            )
            for call, outcome in zip(completion.tool_calls, outcomes, strict=True):
                called.append(call.name)
                content = self._fitted(outcome, session_id=session_id)
                history.append({"role": "tool", "tool_call_id": call.id, "content": content})
        answer = (
            f"I stopped after {self.settings.max_iterations} rounds of tool calls without reaching a final "
            "answer (the agent's max_iterations limit). Ask me to continue, or narrow the request."
        )
        history.append({"role": "assistant", "content": answer})
        await on_text(answer)
        return LoopResult(
            answer=answer, tools_called=called, iterations=self.settings.max_iterations, hit_iteration_limit=True,
            usage=usage,
        )  # fmt: skip

    def _fitted(self, outcome: ToolOutcome, *, session_id: str) -> str:
        """A long result goes to working memory (index returned, reader installed), else is cut if it cannot."""
        content = outcome.for_model()
        limit = self.settings.max_result_chars
        if len(content) <= limit:
            return content
        if self._offer_reader():
            return self.memory.offload(session_id=session_id, tool_name=outcome.name, content=content, threshold=limit)
        return f"{content[:limit]}\n[result truncated: {len(content) - limit} characters omitted]"

    def _offer_reader(self) -> bool:
        """Offer the working-memory reader unless it is blacklisted; whether it is offered."""
        if self.registry.is_blacklisted(READER):
            return False
        if READER not in self.registry:
            self.registry.register(reader(self.memory))
        return True

    async def _run_tools(
        self, calls: list[ToolCall], *, session_id: str, call_chain: tuple[str, ...], on_event: EventSink | None,
        recorded: RecordedTools | None = None,
    ) -> list[ToolOutcome]:
        async def run_one(call: ToolCall) -> ToolOutcome:
            await emit(on_event, ToolStarted(call_id=call.id, name=call.name, arguments=call.arguments))
            context = ToolContext(session_id=session_id, tool_call_id=call.id, call_chain=call_chain)
            if recorded is not None and call.name != READER:  # nothing runs (but reading this turn's own
                # working memory, which a long recorded result went to): no approval asked either
                outcome = _replayed(self.registry, recorded, call, context=context)
                await emit(on_event, ToolFinished(call_id=call.id, name=call.name, error=outcome.error,
                                                   duration_seconds=0.0))
                return outcome
            refused = None if self.approvals is None else await self.approvals.check(
                call, context=context, on_event=on_event)
            if refused is not None:
                outcome = self.registry.refuse(call.name, call.arguments, context=context, error=refused)
            else:
                outcome = await self.registry.invoke(call.name, call.arguments, context=context)
            await emit(
                on_event,
                ToolFinished(
                    call_id=call.id, name=call.name, error=outcome.error, duration_seconds=outcome.duration_seconds
                ),
            )
            return outcome

        if not self.settings.parallel_tool_calls or len(calls) == 1:
            return [await run_one(call) for call in calls]
        gate = asyncio.Semaphore(self.settings.max_parallel)

        async def gated(call: ToolCall) -> ToolOutcome:
            async with gate:
                return await run_one(call)

        return list(await asyncio.gather(*(gated(call) for call in calls)))


def _replayed(registry: ToolRegistry, recorded: RecordedTools, call: ToolCall, *, context: ToolContext) -> ToolOutcome:
    """A recorded replay's answer to `call`: the matching recorded call's result, else that it was not run."""
    found = recorded.take(call.name, call.arguments)
    if found is None:
        return registry.answer(call.name, call.arguments, context=context, error=recorded.not_recorded(call.name))
    error = recorded.error_of(found)
    return registry.answer(call.name, call.arguments, context=context, content="" if error else found.result,
                           error=error)
