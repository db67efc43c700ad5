"""The console's side of approvals: tool calls waiting for a person, held until someone decides or they expire.

Agents put an `ApprovalRequest` on `console.approvals`. The desk takes one only from the agent it names
(the broker-validated sender) and with the agent's own replies queue to answer on, then holds the
message unacknowledged while it waits: if the console restarts, the broker hands the request to the next
console, so a pending call is never forgotten while its agent still waits. A decision is sent back with
the console's own login (the only one the agent believes) and names who decided, as the console's gate
validated them. An Event on the Agent says a call waits (posted by the console, never by the agent pod).

The desk is shared by every agent, so each gets a bounded part of it: at most `PENDING_PER_AGENT` calls held
(further ones are denied at once, saying why), each request at most `MAX_REQUEST_BYTES`, and no call waits longer
than `MAX_WAIT_SECONDS` whatever expiry its request names. One agent's flood is answered as fast as it comes and
never stands between another agent's call and a person.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rockbot.bus import CONSOLE, Bus, Principal, Subscription
from rockbot.bus.errors import Refused
from rockbot.bus.messages import Delivery
from rockbot.bus.topology import CONSOLE_APPROVALS, Queue, agent_replies_prefix
from rockbot.contracts.approvals import ApprovalDecision, ApprovalRequest
from rockbot.kube import AGENTS, ApiError, KubeClient
from rockbot.kube.events import EventPoster
from rockbot.resources.common import MAX_APPROVAL_SECONDS

log = logging.getLogger(__name__)

#: Calls of one agent held at once by a console process (each an unacknowledged message of at most
#: `MAX_REQUEST_BYTES`); that agent's further requests are denied at once, saying why, so one agent's flood never
#: stands between another agent's call and a person.
PENDING_PER_AGENT = 20
MAX_REQUEST_BYTES = 128 * 1024
#: The longest a call waits on the desk, whatever its request says: the longest `timeoutSeconds` an Agent or Tool has.
MAX_WAIT_SECONDS = MAX_APPROVAL_SECONDS
#: Requests taken from the queue ahead: the protocol's most, so the bound that holds is the per-agent one, not a
#: share of the desk that one agent could fill.
PREFETCH = 65_535

#: Called when a call starts waiting (to post an Event on its Agent); best effort.
OnPending = Callable[[ApprovalRequest], Awaitable[None]]


def event_on_agent(kube: KubeClient) -> OnPending:
    """Post a Normal Event `ToolCallWaitingForApproval` on the Agent whose call waits (`kubectl describe agent`)."""
    post = EventPoster(kube, component="rockbot-console")

    async def on_pending(request: ApprovalRequest) -> None:
        try:
            agent = await kube.get(AGENTS, namespace=request.namespace, name=request.agent)
        except ApiError as exc:
            log.warning("no Event for approval %s: reading its Agent failed (%s)", request.approval_id, exc)
            return
        expires = request.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        await post(agent, "Normal", "ToolCallWaitingForApproval",
                   f"a call of {request.tool_name} waits for a person's approval until {expires} (then "
                   f"{'denied' if request.on_timeout == 'Deny' else 'allowed'}); approve or deny it in the console "
                   f"(approval {request.approval_id})")

    return on_pending


class UnknownApproval(LookupError):
    """No call waits under this id (decided already, expired, or never asked)."""


@dataclass(kw_only=True)
class Pending:
    request: ApprovalRequest
    reply_to: str
    decided: asyncio.Future[ApprovalDecision] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class ApprovalDesk:
    def __init__(self, *, on_pending: OnPending | None = None,
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)) -> None:
        self._bus: Bus | None = None
        self._on_pending = on_pending
        self._clock = clock
        self._pending: dict[str, Pending] = {}
        self._held: dict[Principal, int] = {}  # calls held per agent
        self._subscription: Subscription | None = None

    async def start(self, *, bus: Bus) -> None:
        """Take requests from `bus` (the console's own login); until then nothing is pending."""
        self._bus = bus
        self._subscription = await bus.consume(queue=CONSOLE_APPROVALS, handler=self._hold, prefetch=PREFETCH)

    async def stop(self) -> None:
        """Stop holding requests; those still pending go back to the queue for the next console."""
        if self._subscription is not None:
            await self._subscription.close()
            self._subscription = None

    def pending(self, *, namespaces: set[str] | None = None) -> list[ApprovalRequest]:
        """The calls waiting now (of `namespaces`, when given), oldest first."""
        now = self._clock()
        return sorted((p.request for p in self._pending.values() if p.request.expires_at > now
                       and (namespaces is None or p.request.namespace in namespaces)),
                      key=lambda r: r.requested_at)

    def get(self, approval_id: str) -> ApprovalRequest:
        held = self._pending.get(approval_id)
        if held is None or held.decided.done():
            raise UnknownApproval(approval_id)
        return held.request

    def decision(self, approval_id: str) -> asyncio.Future[ApprovalDecision]:
        """The decision on a waiting call, once made (cancelled when the call stops waiting undecided)."""
        held = self._pending.get(approval_id)
        if held is None:
            raise UnknownApproval(approval_id)
        return held.decided

    async def decide(self, *, approval_id: str, approved: bool, reason: str, decided_by: str) -> ApprovalDecision:
        """Send the decision to the waiting agent; `UnknownApproval` when nothing waits under that id."""
        held = self._pending.get(approval_id)
        if held is None or held.decided.done() or self._bus is None:
            raise UnknownApproval(approval_id)
        decision = ApprovalDecision(approval_id=approval_id, approved=approved, reason=reason[:2000],
                                    decided_by=decided_by, decided_at=self._clock())
        # the agent declared its replies queue and checked it was its own (`_hold`); the desk only publishes there
        await self._bus.publish(queue=Queue(name=held.reply_to), body=decision, correlation_id=approval_id)
        held.decided.set_result(decision)
        log.info("tool call %s", "approved" if approved else "denied",
                 extra={"approval_id": approval_id, "decided_by": decided_by, "tool": held.request.tool_name,
                        "agent": f"{held.request.namespace}/{held.request.agent}"})
        return decision

    async def _hold(self, delivery: Delivery) -> None:
        agent = delivery.agent_answered_on_own(lambda p: agent_replies_prefix(namespace=p.namespace, name=p.name))
        if agent is None:
            raise Refused(f"an approval request from {delivery.user_id!r} must come from an agent and be answered on "
                          f"one of its own reply queues, not {delivery.reply_to!r}")
        request = delivery.decode(ApprovalRequest, max_bytes=MAX_REQUEST_BYTES)
        if (request.namespace, request.agent) != (agent.namespace, agent.name):
            raise Refused(f"{delivery.user_id} asked for approval in the name of {request.namespace}/{request.agent}")
        now = self._clock()
        expires_at = min(request.expires_at, now + datetime.timedelta(seconds=MAX_WAIT_SECONDS))
        if expires_at <= now or request.approval_id in self._pending:
            return  # expired before anyone could see it, or a copy of one already held
        if self._held.get(agent, 0) >= PENDING_PER_AGENT:
            await self._deny_at_once(request, reply_to=str(delivery.reply_to), agent=agent)
            return
        held = Pending(request=request.model_copy(update={"expires_at": expires_at}), reply_to=str(delivery.reply_to))
        self._pending[request.approval_id] = held
        self._held[agent] = self._held.get(agent, 0) + 1
        try:
            if self._on_pending is not None and not delivery.redelivered:
                await self._on_pending(held.request)
            async with asyncio.timeout((expires_at - now).total_seconds()):
                await held.decided
        except TimeoutError:
            log.info("approval %s expired undecided", request.approval_id)
        finally:
            self._pending.pop(request.approval_id, None)
            self._held[agent] -= 1
            if not self._held[agent]:
                del self._held[agent]
            held.decided.cancel()  # no-op once decided; tells whoever else asks that it waits no more

    async def _deny_at_once(self, request: ApprovalRequest, *, reply_to: str, agent: Principal) -> None:
        """Deny a call past its agent's share of the desk (nobody saw it), so the agent need not wait to learn it."""
        assert self._bus is not None
        log.warning("denying approval %s of %s at once: %d of its calls already wait for a person",
                    request.approval_id, agent, PENDING_PER_AGENT)
        decision = ApprovalDecision(
            approval_id=request.approval_id, approved=False, decided_by=CONSOLE.user, decided_at=self._clock(),
            reason=f"{PENDING_PER_AGENT} calls of {agent.agent_id} already wait for a person's approval, the most one "
                   "agent may have waiting: nobody was shown this one; ask again once those are decided",
        )  # fmt: skip
        await self._bus.publish(queue=Queue(name=reply_to), body=decision, correlation_id=request.approval_id)
