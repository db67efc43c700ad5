"""The agent's inbox: user messages, scheduled tasks, Trigger runs and other agents' calls, one handler.

Each `InboxRequest` becomes a turn of the conversation its sender (`user_id`, checked by the broker)
keeps under its session id (see `ConversationKey`: another sender's same session id is another
conversation); the outcome goes back as an `InboxReply` to `reply_to` (when there is one). Nothing
is acked before it is handled: the bus acks after this handler returns, i.e. after the reply is
published. A call that would loop back to this agent or go too deep is refused before any work (see
`delegation`), and every failure, including an unreadable message, is answered as an error, never
silently dropped.

Who asks is the message's sender (`user_id`, checked by the broker): answers go only to one of the
sender's own reply queues (a request asking for replies elsewhere is dead-lettered unanswered); an
`agent_call` must come from the agent its `call_chain` names last, a `scheduled_task` from the
operator (or `rockbot local`), a `trigger` from the gateway (or `rockbot local`), an `evaluation` (whose
case answers the turn's approvals itself) from the operator (or `rockbot local`), a `user_message`
from a platform service, and one that speaks for a person (`on_behalf_of`, recorded as the caller
`console:<user>`), carries the session's recorded conversation or replays a recorded run (`Replay`: its tool
results would otherwise be anyone's forgery) only from the console; a request
over `MAX_REQUEST_BYTES` is refused before it is parsed. Those refusals are answered, then dead-lettered.
A request that asks for `progress` gets the turn's events (text deltas, tool calls starting and ending)
on its reply queue before the reply. An agent's calls are answered `CALLS_PER_AGENT` at a time; its others
meanwhile are answered at once, `Unavailable` (retryable), so one calling agent cannot hold the inbox.

A request is known by its sender and request id: a redelivered or duplicated copy joins the run in
flight or gets the remembered reply, so the model is not asked (and tools not called) twice, while
the same id with another body or reply queue is Rejected, never answered from memory (nobody gets
another caller's answer by replaying its id). A retryable error reply (the model endpoint was
down) is not remembered, so a later copy of the request runs again.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import nullcontext

from rockbot.agent.approvals import case_answers
from rockbot.agent.budget import BudgetExhausted
from rockbot.agent.events import EventSink
from rockbot.agent.llm import LlmAuthError, LlmError
from rockbot.agent.progress import ProgressRelay
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.toolsets.delegation import refusal
from rockbot.bus import (
    CONSOLE,
    GATEWAY,
    LOCAL,
    OPERATOR,
    BadMessage,
    Bus,
    Delivery,
    Nacked,
    NoRoute,
    Principal,
    Refused,
    Subscription,
    TooLarge,
)
from rockbot.bus.once import Conflict, RunOnce
from rockbot.bus.permissions import is_reply_queue_of
from rockbot.bus.shares import InFlight
from rockbot.bus.topology import agent_inbox
from rockbot.contracts.conversations import console_caller
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.inbox import MAX_REQUEST_BYTES, InboxReply, InboxRequest

log = logging.getLogger(__name__)

#: Calls of one calling agent answered at once by one agent process (each a model turn); its others meanwhile are
#: answered at once, Unavailable, so one caller's flood never stands before another caller's call. Platform services
#: (the console's people, scheduled runs, Triggers) are trusted and bounded where they start work.
CALLS_PER_AGENT = 2


async def serve_inbox(*, runtime: AgentRuntime, bus: Bus, prefetch: int = 8) -> Subscription:
    """Start consuming this agent's inbox; close the returned subscription to stop."""
    config = runtime.config
    agent_id = f"{config.namespace}/{config.name}"
    once: RunOnce[InboxReply] = RunOnce()  # a turn outlives a delivery lost with the connection
    calls = InFlight(per_sender=CALLS_PER_AGENT)

    async def handle(delivery: Delivery) -> None:
        sender = delivery.sender
        assert sender is not None  # the bus refuses messages without one
        if delivery.reply_to and not is_reply_queue_of(sender, delivery.reply_to):
            raise Refused(f"{sender} asked for replies on {delivery.reply_to!r}, which is not one of its own queues")
        request_id = delivery.correlation_id or delivery.message_id or "unknown"
        try:
            request = delivery.decode(InboxRequest, max_bytes=MAX_REQUEST_BYTES)
        except BadMessage as exc:
            log.warning("unreadable inbox message %s: %s", delivery.message_id, exc)
            error = ErrorInfo(code=ErrorCode.INVALID_ARGUMENTS, message=str(exc))
            await _answer(bus, delivery, InboxReply(request_id=request_id, session_id="unknown", error=error))
            if isinstance(exc, TooLarge):
                raise Refused(str(exc)) from None
            return
        problem = _misaddressed(request, sender=sender)
        if problem is not None:
            error = ErrorInfo(code=ErrorCode.REJECTED, message=problem)
            await _answer(bus, delivery, InboxReply(request_id=request_id, session_id=request.session_id, error=error))
            raise Refused(problem)
        key = (sender.user, request.request_id)
        # a copy of a call taken before joins it (RunOnce), whatever share its caller holds; services are trusted
        share = calls.slot(sender.user) if sender.kind == "agent" and not once.knows(key) else nullcontext(True)
        with share as admitted:
            if not admitted:
                error = ErrorInfo(code=ErrorCode.UNAVAILABLE, retryable=True, message=(
                    f"{CALLS_PER_AGENT} calls of {sender.agent_id} are being answered by {agent_id}: call again "
                    "once they are answered"))  # fmt: skip
                reply = InboxReply(request_id=request.request_id, session_id=request.session_id, error=error)
            else:
                reply = await _turn(runtime, bus, once, delivery=delivery, request=request, key=key,
                                    agent_id=agent_id)
        await _answer(bus, delivery, reply)

    return await bus.consume(
        queue=agent_inbox(namespace=config.namespace, name=config.name), handler=handle, prefetch=prefetch
    )


async def _turn(runtime: AgentRuntime, bus: Bus, once: RunOnce[InboxReply], *, delivery: Delivery,
                request: InboxRequest, key: tuple[str, str], agent_id: str) -> InboxReply:
    """The reply to `request`: its turn's, run once however often it arrives (progress relayed first, if asked)."""
    fingerprint = hashlib.sha256(request.model_dump_json().encode() + b"\0" + (delivery.reply_to or "").encode())
    caller = console_caller(request.on_behalf_of) if request.on_behalf_of else key[0]
    relay = (ProgressRelay(bus=bus, reply_to=delivery.reply_to, request_id=request.request_id)
             if request.progress and delivery.reply_to else None)  # fmt: skip
    try:
        return await once.run(
            key=key, fingerprint=fingerprint.hexdigest(),
            work=lambda: _remembered(runtime, request, agent_id=agent_id, caller=caller, on_event=relay),
        )  # fmt: skip
    except _Retryable as retryable:
        return retryable.reply
    except Conflict:
        error = ErrorInfo(
            code=ErrorCode.REJECTED,
            message=f"request_id {request.request_id!r} was already used for another request or reply queue; "
            "send each request with a fresh request_id",
        )
        return InboxReply(request_id=request.request_id, session_id=request.session_id, error=error)
    finally:
        if relay is not None:
            await relay.close()  # every progress message before the reply


def _misaddressed(request: InboxRequest, *, sender: Principal) -> str | None:
    """Why `sender` may not send this kind of request, or None."""
    if request.kind == "agent_call" and (sender.kind != "agent" or request.call_chain[-1] != sender.agent_id):
        return f"an agent_call names {request.call_chain[-1]} as its caller but comes from {sender}"
    if request.kind == "scheduled_task" and sender not in (OPERATOR, LOCAL):
        return f"scheduled tasks come from the operator, not from {sender}"
    if request.kind == "trigger" and sender not in (GATEWAY, LOCAL):
        return f"Trigger runs come from the gateway, not from {sender}"
    if request.kind == "evaluation" and sender not in (OPERATOR, LOCAL):
        return f"evaluation cases come from the operator (or rockbot local), not from {sender}"
    if request.kind == "user_message" and sender.kind != "service":
        return f"user messages come through a platform service, not from {sender}; agents send agent_call"
    if request.on_behalf_of is not None and sender != CONSOLE:
        return f"only the console speaks for a person (on_behalf_of), not {sender}"
    if request.conversation is not None and sender != CONSOLE:
        return f"only the console sends a conversation with a turn (from the run store), not {sender}"
    if request.replay is not None and sender != CONSOLE:
        return f"only the console replays a recorded run (its tool results are the store's), not {sender}"
    return None


class _Retryable(Exception):
    """Carries a retryable error reply out of `RunOnce`, which remembers results but not failures."""

    def __init__(self, reply: InboxReply):
        super().__init__(reply.error.message if reply.error else "retryable")
        self.reply = reply


async def _remembered(runtime: AgentRuntime, request: InboxRequest, *, agent_id: str, caller: str,
                      on_event: EventSink | None) -> InboxReply:
    reply = await _handle(runtime, request, agent_id=agent_id, caller=caller, on_event=on_event)
    if reply.error is not None and reply.error.retryable:
        raise _Retryable(reply)
    return reply


async def _handle(runtime: AgentRuntime, request: InboxRequest, *, agent_id: str, caller: str,
                  on_event: EventSink | None) -> InboxReply:
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
    prior = [turn.model_dump() for turn in request.prior_turns] if request.kind == "evaluation" else None
    answering = case_answers(request.approvals) if request.approvals is not None else nullcontext()
    try:
        with answering:
            result = await runtime.chat(
                request.session_id, request.content, caller=caller, call_chain=request.call_chain, on_event=on_event,
                source=request.kind, request_id=request.request_id,
                parent_run_id=request.parent_run_id if request.kind == "agent_call" else None,
                recorded=request.conversation, replay=request.replay, prior=prior,
            )  # fmt: skip
    except BudgetExhausted as exc:
        return failed(ErrorCode.REJECTED, str(exc))
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
        run_id=result.run_id,
        prompt_tokens=result.usage.prompt_tokens,
        completion_tokens=result.usage.completion_tokens,
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
    except Nacked as exc:  # never requeue the request for it: its turn would run again, for nothing
        log.warning("the broker refused the reply to %s on %s (%s); dropping it", reply.request_id,
                    delivery.reply_to, exc)
