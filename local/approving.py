"""`rockbot local`'s approvals: a tool call that needs a person's approval asks in the chat, `approve? [y/N]`.

The person at the terminal is the approver (named by their login on this machine). Anything but `y` or
`yes`, and the end of the input, deny the call; one question is asked at a time, in the order the calls
wait. The agent's timeout still applies: unanswered in time, the call follows its `onTimeout`.

With the local console on (the default), agents ask the console's approval desk over the bus, as in a
cluster, and every waiting call shows on its Approvals page. A call of a turn typed at the terminal is also
asked there (`ConsoleAndTerminal`): the first answer, in the console or at the terminal, decides, and the
other side stops asking. Calls of other turns (console chats, ScheduledTasks, Triggers) wait in the console
only, so the terminal never asks about work the person there did not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import getpass
import sys
from typing import TextIO

from rockbot.console.approvals import ApprovalDesk, UnknownApproval
from rockbot.contracts.approvals import ApprovalDecision, ApprovalRequest
from rockbot.local.terminal import Terminal
from rockbot.tasks import cancel_and_wait

_YES = {"y", "yes"}


class TerminalApprover:
    def __init__(self, *, terminal: Terminal, err: TextIO = sys.stderr, user: str | None = None) -> None:
        self._terminal = terminal
        self._err = err
        self._user = user or f"local:{getpass.getuser()}"
        self._one_at_a_time = asyncio.Lock()

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        async with self._one_at_a_time:
            self._err.write(f"  ? {request.agent} wants to run {request.tool_name} with {request.arguments}\n")
            self._err.flush()
            answer = await self._terminal.line("  approve? [y/N] ")
        approved = (answer or "").strip().lower() in _YES
        reason = "" if approved else ("no answer (the input ended)" if answer is None else "denied in the chat")
        return ApprovalDecision(approval_id=request.approval_id, approved=approved, reason=reason,
                                decided_by=self._user, decided_at=datetime.datetime.now(datetime.UTC))


class ConsoleAndTerminal:
    """The console desk's `on_pending`: asks at the terminal too when the call is one of `conversations` (the
    terminal chat's), and hands whichever answer comes first to the desk."""

    def __init__(self, *, approver: TerminalApprover, conversations: set[str], err: TextIO = sys.stderr) -> None:
        self._approver = approver
        self._conversations = conversations
        self._err = err
        self.desk: ApprovalDesk | None = None
        self._asking: set[asyncio.Task[None]] = set()

    async def on_pending(self, request: ApprovalRequest) -> None:
        if self.desk is not None and request.session_id in self._conversations:
            task = asyncio.create_task(self._ask(self.desk, request), name=f"approve {request.approval_id}")
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _ask(self, desk: ApprovalDesk, request: ApprovalRequest) -> None:
        try:
            decided = desk.decision(request.approval_id)
        except UnknownApproval:
            return
        asking = asyncio.ensure_future(self._approver.ask(request))
        await asyncio.wait({asking, decided}, return_when=asyncio.FIRST_COMPLETED)
        if asking.done():
            answer = asking.result()
            with contextlib.suppress(UnknownApproval):  # the console decided in the same instant
                await desk.decide(approval_id=request.approval_id, approved=answer.approved, reason=answer.reason,
                                  decided_by=answer.decided_by)
            return
        await cancel_and_wait(asking)
        if decided.cancelled():
            self._err.write("\n  (no decision in time)\n")
        else:
            decision = decided.result()
            self._err.write(f"\n  ({'approved' if decision.approved else 'denied'} in the console by "
                            f"{decision.decided_by})\n")
        self._err.flush()
