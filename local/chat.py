"""The terminal side of `rockbot local`: progress while tools run, the answer, the tools that were called."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TextIO

from rockbot.agent.events import Event, TextDelta, ToolFinished, ToolStarted
from rockbot.agent.llm import LlmError
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import LOCAL
from rockbot.contracts.inbox import InboxReply
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.tasks import cancel_and_wait

SESSION = "local-terminal"
#: Seconds without a word from the model before the chat says it is still waiting (and again after as many).
WAIT_NOTICE_SECONDS = 5.0


class Printer:
    """Writes the answer to `out` as it streams, and progress lines to `err`."""

    def __init__(
        self, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr, wait_notice_seconds: float = WAIT_NOTICE_SECONDS
    ) -> None:
        self.out = out
        self.err = err
        self.wait_notice_seconds = wait_notice_seconds
        self._streamed = False
        self._tools_running = 0
        self._heard = time.monotonic()

    async def waiting(self, *, model: str, timeout_seconds: float) -> None:
        """Until cancelled: a line each `wait_notice_seconds` the model stays silent while no tool runs."""
        started = self._heard = time.monotonic()
        while True:
            await asyncio.sleep(self.wait_notice_seconds / 4)
            silent = time.monotonic() - self._heard
            if self._tools_running or silent < self.wait_notice_seconds:
                continue
            self._heard = time.monotonic()
            gap = "\n" if self._streamed else ""
            self.err.write(f"{gap}  … waiting for the model {model} "
                           f"({time.monotonic() - started:.0f} s; each request times out after "
                           f"{timeout_seconds:g} s of silence)\n")  # fmt: skip
            self.err.flush()

    def __call__(self, event: Event) -> None:
        self._heard = time.monotonic()
        if isinstance(event, ToolStarted):
            self._tools_running += 1
        elif isinstance(event, ToolFinished):
            self._tools_running -= 1
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


def banner(name: str, agent: AgentRuntime) -> str:
    """Which model the chat uses and the tools it is offered (blacklisted ones are registered, not offered)."""
    tools = ", ".join(tool["function"]["name"] for tool in agent.registry.openai_tools()) or "none"
    return f"[{name}: {agent.config.model.name} at {agent.config.model.base_url}; tools: {tools}]"


async def isolation_line(scripts: ScriptsManager) -> str:
    """What the sandbox's isolation canary found, as the scripts-manager's /readyz says it (EgressRestricted)."""
    if scripts.canary is not None:
        await scripts.canary.first_proof()
    return f"[sandbox: {scripts.readiness.conditions()[0]}]"


async def ask(agent: AgentRuntime, text: str, *, printer: Printer) -> bool:
    """One turn; a model that cannot be reached or refuses is reported in one line, not a traceback."""
    model = agent.config.model
    waiting = asyncio.create_task(printer.waiting(model=model.name, timeout_seconds=model.request_timeout_seconds))
    try:
        result = await agent.chat(SESSION, text, caller=LOCAL.user, on_event=printer)
    except LlmError as error:
        printer.err.write(f"error: {error}\n")
        printer.err.flush()
        return False
    finally:
        await cancel_and_wait(waiting)
    printer.finish(result.answer, list(result.tools_called))
    return True
