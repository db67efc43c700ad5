"""`rockbot local`'s approvals: a tool call that needs a person's approval asks in the chat, `approve? [y/N]`.

The person at the terminal is the approver (named by their login on this machine). Anything but `y` or
`yes`, and the end of the input, deny the call; one question is asked at a time, in the order the calls
wait. The agent's timeout still applies: unanswered in time, the call follows its `onTimeout`.
"""

from __future__ import annotations

import asyncio
import datetime
import getpass
import sys
from typing import TextIO

from rockbot.contracts.approvals import ApprovalDecision, ApprovalRequest
from rockbot.local.terminal import Terminal

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
