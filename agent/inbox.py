"""The agent's inbox: user messages, scheduled-task triggers and other agents' calls, one handler.

Each `InboxRequest` becomes a turn of the conversation named by its session id; the outcome goes
back as an `InboxReply` to `reply_to` (when there is one). Nothing is acked before it is handled:
the bus acks after this handler returns, i.e. after the reply is published. A call that would
loop back to this agent or go too deep is refused before any work (see `delegation`), and every
failure, including an unreadable message, is answered as an error, never silently dropped. A
request id is worked on once: a redelivered or duplicated copy joins the run in flight or gets the
remembered reply, so the model is not asked (and tools not called) twice. A retryable error reply
(the model endpoint was down) is not remembered, so a later copy of the request runs again.
"""

from __future__ import annotations

import logging

from rockbot.agent.llm import LlmAuthError, LlmError
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.toolsets.delegation import refusal
from rockbot.bus import BadMessage, Bus, Delivery, NoRoute, Subscription
from rockbot.bus.once import RunOnce
from rockbot.bus.topology import agent_inbox
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.inbox import InboxReply, InboxRequest

log = logging.getLogger(__name__)


async def serve_inbox(*, runtime: AgentRuntime, bus: Bus, prefetch: int = 8) -> Subscription:
    """Start consuming this agent's inbox; close the returned subscription to stop."""
    config = runtime.config
    agent_id = f"{config.namespace}/{config.name}"
    once: RunOnce[InboxReply] = RunOnce()  # a turn outlives a delivery lost with the connection

    async def handle(delivery: Delivery) -> None:
        try:
            request = delivery.decode(InboxRequest)
        except BadMessage as exc:
            log.warning("unreadable inbox message %s: %s", delivery.message_id, exc)
            await _answer(bus, delivery, InboxReply(
                request_id=delivery.correlation_id or delivery.message_id or "unknown",
                session_id="unknown",
                error=ErrorInfo(code=ErrorCode.INVALID_ARGUMENTS, message=str(exc)),
            ))
            return
        try:
            reply = await once.run(key=request.request_id, work=lambda: _remembered(runtime, request, agent_id))
        except _Retryable as retryable:
            reply = retryable.reply
        await _answer(bus, delivery, reply)

    return await bus.consume(
        queue=agent_inbox(namespace=config.namespace, name=config.name), handler=handle, prefetch=prefetch
    )


class _Retryable(Exception):
    """Carries a retryable error reply out of `RunOnce`, which remembers results but not failures."""

    def __init__(self, reply: InboxReply):
        super().__init__(reply.error.message if reply.error else "retryable")
        self.reply = reply


async def _remembered(runtime: AgentRuntime, request: InboxRequest, agent_id: str) -> InboxReply:
    reply = await _handle(runtime, request, agent_id=agent_id)
    if reply.error is not None and reply.error.retryable:
        raise _Retryable(reply)
    return reply


async def _handle(runtime: AgentRuntime, request: InboxRequest, *, agent_id: str) -> InboxReply:
    def failed(code: ErrorCode, message: str, *, retryable: bool = False) -> InboxReply:
        return InboxReply(
            request_id=request.request_id,
            session_id=request.session_id,
            error=ErrorInfo(code=code, message=message, retryable=retryable),
        )

    if request.kind == "agent_call":
        reason = refusal(chain=request.call_chain, target=agent_id)
        if reason is not None:
            return failed(ErrorCode.REJECTED, reason)
    try:
        result = await runtime.chat(request.session_id, request.content, call_chain=request.call_chain)
    except LlmAuthError as exc:
        return failed(ErrorCode.UNAVAILABLE, str(exc))
    except LlmError as exc:
        return failed(ErrorCode.UNAVAILABLE, str(exc), retryable=exc.retryable)
    except Exception as exc:  # the edge: the caller gets an answer, not a wait until its timeout
        log.exception("request %s failed", request.request_id)
        return failed(ErrorCode.EXECUTION_FAILED, f"the agent failed on this request: {type(exc).__name__}: {exc}")
    return InboxReply(
        request_id=request.request_id,
        session_id=request.session_id,
        answer=result.answer,
        tools_called=tuple(result.tools_called),
    )


async def _answer(bus: Bus, delivery: Delivery, reply: InboxReply) -> None:
    if not delivery.reply_to:
        if reply.error is not None:
            log.warning("request %s failed and nobody waits for the answer: %s", reply.request_id, reply.error.message)
        return
    try:
        await bus.reply(to=delivery, body=reply)
    except NoRoute:
        log.warning("the caller of %s is gone (no queue %s); dropping its reply", reply.request_id, delivery.reply_to)
