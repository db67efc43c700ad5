"""The terminal side of `rockbot local`: progress while tools run, the answer, the tools that were called."""

from __future__ import annotations

import sys
from typing import TextIO

from rockbot.agent.events import Event, TextDelta, ToolFinished, ToolStarted
from rockbot.agent.llm import LlmError
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import LOCAL
from rockbot.contracts.inbox import InboxReply

SESSION = "local-terminal"


class Printer:
    """Writes the answer to `out` as it streams, and progress lines to `err`."""

    def __init__(self, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out = out
        self.err = err
        self._streamed = False

    def __call__(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.out.write(event.text)
            self.out.flush()
            self._streamed = True
        elif isinstance(event, ToolStarted):
            self.err.write(f"  … running {event.name}\n")
        elif isinstance(event, ToolFinished):
            if event.error is None:
                self.err.write(f"  ✓ {event.name} ({event.duration_seconds:.2f} s) ok\n")
            else:
                error = f"{event.error.code}: {event.error.message}"
                self.err.write(f"  ✗ {event.name} ({event.duration_seconds:.2f} s) {error}\n")
        self.err.flush()

    def finish(self, answer: str, tools: list[str]) -> None:
        if not self._streamed:
            self.out.write(answer)
        self.out.write("\n")
        self.out.flush()
        self._streamed = False
        self.err.write(f"[tools called: {', '.join(tools) if tools else 'none'}]\n")
        self.err.flush()

    def task_report(self, task: str, reply: InboxReply | None, problem: str | None) -> None:
        if reply is not None and reply.answer is not None:
            self.err.write(f"[task {task}] {reply.answer}\n")
        elif reply is not None and reply.error is not None:
            self.err.write(f"[task {task}] {reply.error.code}: {reply.error.message}\n")
        else:
            self.err.write(f"[task {task}] {problem}\n")
        self.err.flush()


    def trigger_report(self, trigger: str, answer: str | None, error: str | None) -> None:
        self.err.write(f"[trigger {trigger}] {answer if error is None else error}\n")
        self.err.flush()


def banner(name: str, agent: AgentRuntime, *, base_url: str) -> str:
    """Which model the chat uses and the tools it is offered (blacklisted ones are registered, not offered)."""
    tools = ", ".join(tool["function"]["name"] for tool in agent.registry.openai_tools()) or "none"
    return f"[{name}: {agent.config.model.name} at {base_url}; tools: {tools}]"


async def ask(agent: AgentRuntime, text: str, *, printer: Printer) -> bool:
    """One turn; a model that cannot be reached or refuses is reported in one line, not a traceback."""
    try:
        result = await agent.chat(SESSION, text, caller=LOCAL.user, on_event=printer)
    except LlmError as error:
        printer.err.write(f"error: {error}\n")
        printer.err.flush()
        return False
    printer.finish(result.answer, list(result.tools_called))
    return True
