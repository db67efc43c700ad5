"""An agent process's token usage, reported to the operator, and the day's total it learns back.

The agent pod has no Kubernetes rights, so it cannot write `Agent.status`; it sends the tokens used
since its last report to `operator.usage` (see `rockbot.contracts.usage`) and the operator, which
adds up every replica's reports, answers with the Agent's total for the day. That total is what the
daily budget (`budget.TokenBudget`) checks against, with what this process used since. Reports go
out `interval_seconds` after tokens were used (a burst of model requests is one report), and, when
the Agent has a budget, at least every `refresh_seconds` even when idle (other replicas may have
used some), and once at start (a new process learns what the day has used so far). A report that
gets no answer is sent again `interval_seconds` later, with whatever was used meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from rockbot.agent.budget import TokenBudget
from rockbot.agent.llm import Usage
from rockbot.bus import OPERATOR, BadMessage, Bus, BusError
from rockbot.bus.topology import OPERATOR_USAGE
from rockbot.contracts.usage import UsageReport, UsageTotal

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 2.0
REFRESH_SECONDS = 30.0
ANSWER_SECONDS = 15.0


class UsageReporter:
    def __init__(
        self,
        *,
        budget: TokenBudget,
        bus: Bus,
        namespace: str,
        name: str,
        interval_seconds: float = INTERVAL_SECONDS,
        refresh_seconds: float = REFRESH_SECONDS,
        answer_seconds: float = ANSWER_SECONDS,
    ) -> None:
        self._budget = budget
        self._bus = bus
        self._interval = interval_seconds
        self._refresh = refresh_seconds
        self._answer = answer_seconds
        self._failing = False

    async def run(self) -> None:
        """Report until cancelled."""
        while True:
            if await self.report():
                idle = self._refresh if self._budget.limit is not None else None
                try:
                    async with asyncio.timeout(idle):
                        await self._budget.recorded.wait()
                except TimeoutError:
                    pass
            await asyncio.sleep(self._interval)  # a burst of requests goes out as one report

    async def report(self) -> bool:
        """Send what this process used since its last report and take the day's total from the answer."""
        self._budget.recorded.clear()
        day, tokens = self._budget.take_unsent()
        request = UsageReport(day=day, prompt_tokens=tokens.prompt_tokens, completion_tokens=tokens.completion_tokens)
        try:
            reply = await self._bus.request(
                queue=OPERATOR_USAGE, body=request, reply_queue=await self._bus.own_replies(),
                correlation_id=f"usage-{secrets.token_hex(8)}", timeout_seconds=self._answer, responder=OPERATOR,
            )  # fmt: skip
            total = reply.decode(UsageTotal)
        except (BusError, BadMessage) as exc:
            self._budget.unconfirmed()
            if not self._failing:
                log.warning("the operator did not answer this process's token usage report (%s); sending it again "
                            "with the next one", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("the operator answers token usage reports again")
        self._failing = False
        self._budget.confirm(day=total.day, total=Usage(prompt_tokens=total.prompt_tokens,
                                                        completion_tokens=total.completion_tokens))
        return True
