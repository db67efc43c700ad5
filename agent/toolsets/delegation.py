"""Agents as tools: a call is a request/reply over the bus to the other agent's inbox queue.

The callee's final answer is the tool result; its error comes back as data. Every call carries
the chain of agents it passed through (this agent appended), which is how runaway delegation is
stopped on both sides: the caller refuses to call an agent already in the chain (a cycle such as
a -> b -> a) or to go deeper than `MAX_CALL_DEPTH`, and the callee checks the same before it
works (so a misbehaving caller cannot get round it). Calls from one conversation reuse one
session at the callee (`<caller>:<session>`), so follow-up questions keep their context.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from rockbot.agent.recording import current_run
from rockbot.agent.registry import ToolContext, ToolFailure
from rockbot.agent.toolsets.kit import ToolKit
from rockbot.bus import BusError, BusUnavailable, NoRoute, Principal, RequestTimeout
from rockbot.bus.topology import agent_inbox
from rockbot.contracts.agent_config import AgentBackend, ResolvedTool
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.inbox import MAX_CALL_DEPTH, InboxReply, InboxRequest


def refusal(*, chain: tuple[str, ...], target: str) -> str | None:
    """Why a call to `target` down `chain` (callers so far, the current agent last) must not happen."""
    if target in chain:
        return f"calling {target} would loop back ({' -> '.join((*chain, target))}); answer with what you have"
    if len(chain) > MAX_CALL_DEPTH:
        return (
            f"calling {target} would be {len(chain)} agent hops deep (the limit is {MAX_CALL_DEPTH}): "
            f"{' -> '.join((*chain, target))}; answer with what you have"
        )
    return None


def instruction(args: dict[str, Any]) -> str:
    """What the other agent is asked: the `message` of the default schema, or else the arguments as JSON (a Tool
    with its own `parameters` offers those, so whatever the model filled in is what the callee reads)."""
    if set(args) == {"message"} and isinstance(args["message"], str):
        if not args["message"].strip():
            raise ToolFailure(
                "give the agent a non-empty 'message' saying what to do, with all the context it needs",
                code=ErrorCode.INVALID_ARGUMENTS,
            )
        return args["message"]
    return json.dumps(args, ensure_ascii=False)


def agent_tool(resolved: ResolvedTool, *, kit: ToolKit):
    backend = resolved.backend
    assert isinstance(backend, AgentBackend)
    target = f"{backend.namespace}/{backend.name}"
    callee = Principal.agent(namespace=backend.namespace, name=backend.name)
    inbox = agent_inbox(namespace=backend.namespace, name=backend.name)
    wait = max(resolved.timeout_seconds * 0.95, resolved.timeout_seconds - 1.0)

    async def execute(args: dict[str, Any], context: ToolContext) -> str:
        chain = (*context.call_chain, kit.agent_id)
        reason = refusal(chain=chain, target=target)
        if reason is not None:
            raise ToolFailure(reason, code=ErrorCode.REJECTED)
        if kit.bus is None:
            raise ToolFailure(f"cannot call {target}: this agent has no bus connection", code=ErrorCode.UNAVAILABLE)
        replies = await kit.bus.own_replies()
        request = InboxRequest(
            kind="agent_call",
            request_id=f"{kit.config.name}.{secrets.token_hex(8)}",
            session_id=f"{kit.agent_id}:{context.session_id}"[:256],
            content=instruction(args),
            reply_to=replies.name,
            call_chain=chain,
            parent_run_id=run.run_id if (run := current_run()) is not None else None,
        )
        try:
            delivery = await kit.bus.request(
                queue=inbox, body=request, reply_queue=replies, correlation_id=request.request_id,
                timeout_seconds=wait, responder=callee,
            )
        except RequestTimeout:
            raise ToolFailure(
                f"{target} did not answer within {wait:g} s", code=ErrorCode.TIMEOUT, retryable=True
            ) from None
        except (NoRoute, BusUnavailable) as exc:
            raise ToolFailure(f"cannot reach {target}: {exc}", code=ErrorCode.UNAVAILABLE, retryable=True) from exc
        except BusError as exc:
            raise ToolFailure(f"calling {target} failed: {exc}", code=ErrorCode.UNAVAILABLE, retryable=True) from exc
        reply = delivery.decode(InboxReply)
        if reply.error is not None:
            raise ToolFailure(
                f"{target} could not answer: {reply.error.message}",
                code=reply.error.code,
                retryable=reply.error.retryable,
            )
        return reply.answer or ""

    return execute
