"""Tool calls that wait for a person: the gate the tool loop asks before it runs a call that needs approval.

Which calls wait comes from the agent's config: a Tool's `spec.approval` (every tool of its server for a
Tool naming `tool: "*"`), and the Agent's `spec.approval.tools` for built-in or MCP tools by name. An
`Approver` takes the pending call to a person (the console over the bus, `rockbot local`'s terminal) and
returns their decision. A denial, or a timeout with `onTimeout: Deny`, reaches the model as a tool error
(errors as data) and the tool does not run. With no approver at all, such calls are refused (fail closed).

An evaluation case's turn asks nobody: the case's answers (`case_answers`, set by the inbox for the turn)
decide at once, by tool name, and a gated tool the case does not name is denied.

A waiting call lives only in the process that waits: if the agent pod restarts meanwhile, the wait ends
with it and the tool has not run; it never runs for that request. A decision sent afterwards names an
approval nobody waits for and is dropped. A turn that is delivered again (the inbox redelivers a message
its consumer never acknowledged) starts over, and its risky call waits for a new approval.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

from rockbot.agent.events import ApprovalDecided, ApprovalRequested, EventSink, emit
from rockbot.agent.llm import ToolCall
from rockbot.agent.metrics import AgentMetrics
from rockbot.agent.recording import current_run
from rockbot.agent.registry import ToolContext, ToolRegistry
from rockbot.bus import Bus
from rockbot.bus.errors import BusError, RequestTimeout
from rockbot.bus.identity import CONSOLE
from rockbot.bus.topology import CONSOLE_APPROVALS
from rockbot.contracts.agent_config import AgentConfig, ApprovalPolicy
from rockbot.contracts.approvals import MAX_ARGUMENTS_CHARS, ApprovalDecision, ApprovalRequest
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.recording import ApprovalState

log = logging.getLogger(__name__)
_STATES: dict[str, ApprovalState] = {"approved": "Approved", "denied": "Denied", "timed_out": "TimedOut"}


#: The running evaluation case's answers (tool name -> approved), for the turn and the tasks it starts.
_CASE_ANSWERS: contextvars.ContextVar[dict[str, bool] | None] = contextvars.ContextVar("case_answers", default=None)
#: Who decided, as the run store records a case's answer.
CASE_DECIDER = "evaluation"


@contextlib.contextmanager
def case_answers(answers: dict[str, bool]) -> Iterator[None]:
    """Within: gated calls are decided by `answers` (an evaluation case's), never asked of a person."""
    token = _CASE_ANSWERS.set(dict(answers))
    try:
        yield
    finally:
        _CASE_ANSWERS.reset(token)


class Approver(Protocol):
    """Takes a pending call to a person and returns their decision (the gate bounds the wait)."""

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision: ...


class BusApprover:
    """Asks the console over the bus: the request goes to `console.approvals`, the decision comes back on this
    process's replies queue, taken only from the console's own broker login (`service.console`)."""

    def __init__(self, *, bus: Bus) -> None:
        self._bus = bus

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        wait = (request.expires_at - request.requested_at).total_seconds()
        replies = await self._bus.own_replies()
        try:
            delivery = await self._bus.request(
                queue=CONSOLE_APPROVALS, body=request.model_copy(update={"reply_to": replies.name}),
                reply_queue=replies, correlation_id=request.approval_id, timeout_seconds=wait,
                responder=CONSOLE,
            )  # fmt: skip
        except RequestTimeout:
            raise TimeoutError from None
        decision = delivery.decode(ApprovalDecision)
        if decision.approval_id != request.approval_id:
            raise BusError(f"the console answered approval {request.approval_id} about {decision.approval_id}")
        return decision


def _answered(request: ApprovalRequest, answers: dict[str, bool]) -> ApprovalDecision:
    approved = answers.get(request.tool_name, False)
    reason = "" if approved else ("the case denies it" if request.tool_name in answers else "the case does not "
                                  f"answer {request.tool_name}, so it is denied")  # fmt: skip
    return ApprovalDecision(approval_id=request.approval_id, approved=approved, reason=reason,
                            decided_by=CASE_DECIDER, decided_at=request.requested_at)


def policies(config: AgentConfig) -> tuple[dict[str, ApprovalPolicy], dict[str, ApprovalPolicy]]:
    """The approval policies of an agent: by tool name, and by source (`mcp:<server>`) for whole servers."""
    by_name: dict[str, ApprovalPolicy] = {}
    by_source: dict[str, ApprovalPolicy] = {}
    for tool in config.tools:
        if tool.approval is None:
            continue
        if getattr(tool.backend, "tool", None) == "*":
            by_source[tool.source] = tool.approval
        else:
            by_name[tool.name] = tool.approval
    by_name.update(config.approvals)
    return by_name, by_source


class ApprovalGate:
    """Asks for approval of the calls that need it; None means "run it", an error is why it may not run."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        registry: ToolRegistry,
        approver: Approver | None,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._namespace = config.namespace
        self._agent = config.name
        self._by_name, self._by_source = policies(config)
        self._registry = registry
        #: Who asks a person; set once the agent is connected (None: calls that need approval are refused).
        self.approver = approver
        self._metrics = metrics
        self._clock = clock

    def policy(self, name: str) -> ApprovalPolicy | None:
        """The policy of a call of `name`, None when it runs without approval (or would be refused anyway)."""
        tool = self._registry.get(name)
        if tool is None or self._registry.is_blacklisted(name):
            return None  # the registry answers it with an error; nothing would run
        return self._by_name.get(name) or self._by_source.get(tool.source)

    async def check(self, call: ToolCall, *, context: ToolContext, on_event: EventSink | None) -> ErrorInfo | None:
        policy = self.policy(call.name)
        if policy is None:
            return None
        answers = _CASE_ANSWERS.get()
        if answers is None and self.approver is None:
            return ErrorInfo(code=ErrorCode.REJECTED, message=f"{call.name} needs a person's approval and this agent "
                                 "has no way to ask for it: run it with the console (or rockbot local's chat)")
        now = self._clock()
        arguments = call.arguments if len(call.arguments) <= MAX_ARGUMENTS_CHARS else (
            call.arguments[:MAX_ARGUMENTS_CHARS] + f"… [{len(call.arguments) - MAX_ARGUMENTS_CHARS} more characters]")
        request = ApprovalRequest(
            approval_id=uuid.uuid4().hex, namespace=self._namespace, agent=self._agent,
            session_id=context.session_id, tool_call_id=call.id, tool_name=call.name, arguments=arguments,
            requested_at=now, expires_at=now + datetime.timedelta(seconds=policy.timeout_seconds),
            on_timeout=policy.on_timeout,
        )  # fmt: skip
        await emit(on_event, ApprovalRequested(call_id=call.id, name=call.name, approval_id=request.approval_id,
                                               timeout_seconds=policy.timeout_seconds))
        run = current_run()
        if run is not None:
            run.approval(call_id=call.id, name=call.name, approval_id=request.approval_id, state="WaitingForApproval")
        waiting = self._metrics.approvals_waiting.labels(agent=self._agent) if self._metrics else None
        if waiting is not None:
            waiting.inc()
        try:
            if answers is not None:
                decision = _answered(request, answers)
            else:
                assert self.approver is not None
                async with asyncio.timeout(policy.timeout_seconds):
                    decision = await self.approver.ask(request)
        except TimeoutError:
            decision = None
        except BusError as exc:  # nobody could be asked: the call does not run (fail closed)
            log.warning("could not ask for approval of %s: %s", call.name, exc)
            return ErrorInfo(code=ErrorCode.UNAVAILABLE, message=f"{call.name} needs a person's approval, which could "
                                 f"not be asked for ({exc}); it did not run: try again later")
        finally:
            if waiting is not None:
                waiting.dec()
        if decision is None:
            runs = policy.on_timeout == "Allow"
            await self._decided(call, request, outcome="timed_out", runs=runs, on_event=on_event)
            if runs:
                return None
            return ErrorInfo(code=ErrorCode.TIMEOUT, message=f"nobody approved {call.name} within "
                                 f"{policy.timeout_seconds:g} s, so it did not run (onTimeout: Deny)")
        outcome = "approved" if decision.approved else "denied"
        await self._decided(call, request, outcome=outcome, runs=decision.approved, on_event=on_event,
                            decided_by=decision.decided_by, reason=decision.reason)
        if decision.approved:
            return None
        because = f": {decision.reason}" if decision.reason else " (no reason given)"
        return ErrorInfo(code=ErrorCode.REJECTED, message=f"{decision.decided_by} denied this call of {call.name}, "
                             f"so it did not run{because}")

    async def _decided(self, call: ToolCall, request: ApprovalRequest, *, outcome: str, runs: bool,
                       on_event: EventSink | None, decided_by: str = "", reason: str = "") -> None:
        log.info("tool approval %s", outcome, extra={"tool": call.name, "approval_id": request.approval_id,
                                                     "decided_by": decided_by})
        if self._metrics is not None:
            self._metrics.approvals.labels(agent=self._agent, tool=call.name, outcome=outcome).inc()
        run = current_run()
        if run is not None:
            run.approval(call_id=call.id, name=call.name, approval_id=request.approval_id, state=_STATES[outcome],
                         decided_by=decided_by, reason=reason, runs=runs)
        await emit(on_event, ApprovalDecided(call_id=call.id, name=call.name, approval_id=request.approval_id,
                                             outcome=outcome, runs=runs, decided_by=decided_by,  # type: ignore[arg-type]
                                             reason=reason))
