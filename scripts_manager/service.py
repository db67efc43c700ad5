"""The scripts-manager's consumer: take a request from `script.invoke`, run it, reply, then ack.

Who asks is the message's sender (`user_id`, checked by the broker), never a field of the body. A
request is answered only on one of its sender's own reply queues (`agent.<namespace>.<agent>.replies.<n>`):
one without such a `reply_to`, or from anyone but an agent, can never be answered, so it is
dead-lettered at once with a log line (never requeued, never holding a slot). Otherwise every
request is answered: a body over `max_request_bytes` gets InvalidArguments before a byte of it is
parsed, and one whose `agent` is not its sender gets Rejected (both are then dead-lettered too); a
body that is not a valid request gets InvalidArguments naming the field, policy refusals get their
code, sandbox trouble gets Unavailable/ExecutionFailed.

A request runs with the limits of its sender's Agent (`limits.py`): its own cpu, memory and timeout
may only lower them.

A request is known by its sender and request id together (another agent's same id is another
request). It is run at most once while it is in flight: a redelivered or duplicated copy waits for
the same run, and a copy arriving shortly after it finished (the manager died between replying and
acking) gets the remembered answer instead of running the script again. A request that reuses a
request id with a different body (script, input, timeout or packages) or reply queue is answered
Rejected rather than run or answered from memory: a request id is a tool-call id and is never
reused honestly, and running it would put two different answers under one correlation id.

A run outlives its delivery (see `RunOnce`): a delivery cancelled because the broker connection
was lost leaves the script running, and the copy the broker redelivers joins it. Only `stop()`
cancels runs.

A request whose script started under a manager instance that then died is answered by whoever cleans up
after that instance (backends/reaping.py: its `Orphan`s), with a retryable error saying the script may have run
in part; the copy the broker redelivers is then not run again (`ScriptBackend.taken_before`): when a sandbox
took it, its manager (or whoever reaps that one) answers it; when that sandbox was reaped here, it gets the same
error. Only a copy no sandbox ever took runs.

A request that asks to hear when it is taken (the agent's client does, `accept_within_seconds`: see
`Bus.request`) is told so right before its sandbox is claimed or made, once it has its turn under the fair
share and passed the policy and the isolation canary, with the most this manager takes to answer it: its
timeout plus the backend's start-up bound. A request whose asker stopped waiting for that word (it waited in
the queue and for a turn longer than the asker's `accept_within_seconds`) is not started: its answer says so,
and the asker, who has moved on, may send it again without it running twice.

A manager whose Kubernetes credentials were revoked (`CredentialsRevoked`: its pod was force-deleted, and the
process lives on until the kubelet stops it) must take no more work, and no job may fail because of it: at the
first such refusal it hands back at once every request it has not given to its backend yet (their runs are
cancelled, so the broker gets each delivery back unacked and a live manager takes it), and the job that met
the refusal too when its sandbox was never made; a job whose sandbox was made gets the retryable STOPPED
answer (as if a reaper answered it: another manager would not run a copy while that pod exists). `revoked` is
then set, and the process stops (app.py, cli.py).

A run is a span (`run script`: backend, agent, outcome) in the trace of the agent that asked, with
the time the request waited in `script.invoke` as a `queue wait` span; the backend adds its
start-up, run and cleanup spans.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.trace import Status, StatusCode
from pydantic import ValidationError

from rockbot.bus import (
    Bus,
    BusError,
    Delivery,
    Nacked,
    NoRoute,
    Principal,
    Refused,
    ReplyAddress,
    Subscription,
    TooLarge,
)
from rockbot.bus.once import Conflict, RunOnce
from rockbot.bus.topology import SCRIPT_INVOKE, agent_replies_prefix
from rockbot.bus.tracing import queue_wait
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager import policy
from rockbot.scripts_manager.backends import (
    Asker,
    CredentialsRevoked,
    InputFile,
    Orphan,
    SandboxFailure,
    SandboxUnavailable,
    ScriptBackend,
    ScriptJob,
    Taken,
)
from rockbot.scripts_manager.input_files import InputSource, InputsUnavailable
from rockbot.scripts_manager.limits import AgentLimits
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.output_files import ConsoleOutputs
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.scripts_manager.sharing import FairShare
from rockbot.tasks import cancel_and_wait
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

Reply = ScriptInvokeResponse | ScriptInvokeError

#: The answer to a request whose script started under a manager instance that died (or stopped before it ended).
STOPPED = ("the scripts-manager running this script stopped; the script may have run in part: check what it did "
           "(files, messages, changes it makes) before you run it again")


class Isolation(Protocol):
    async def refusal(self) -> ErrorInfo | None:
        """None when scripts may run; else why not (the isolation canary, canary.py)."""


class ScriptService:
    def __init__(
        self, *, bus: Bus, backend: ScriptBackend, settings: ScriptsManagerSettings, metrics: ScriptMetrics,
        limits: AgentLimits, isolation: Isolation | None = None, inputs: InputSource | None = None,
        outputs: ConsoleOutputs | None = None,
        on_revoked: Callable[[CredentialsRevoked], None] | None = None,
    ) -> None:
        self._bus = bus
        self._inputs = inputs
        self._outputs = outputs
        self._limits = limits
        self._backend = backend
        self._isolation = isolation
        self._settings = settings
        self._metrics = metrics
        self._once: RunOnce[Reply] = RunOnce()  # keyed by (sender, request id)
        self._share = FairShare(total=settings.scripts_concurrency, per_agent=settings.scripts_per_agent)
        self._held: Counter[str] = Counter()  # each sender's requests taken and not answered yet
        self._subscription: Subscription | None = None
        self._answering: asyncio.Task[None] | None = None
        self._on_revoked = on_revoked
        #: Why the backend's credentials no longer work (None while they do): nothing more is run.
        self.revoked: CredentialsRevoked | None = None
        self._unstarted: set[asyncio.Task[Reply]] = set()  # runs not yet given to the backend

    @property
    def consuming(self) -> bool:
        return self._subscription is not None

    async def start(self) -> None:
        if self._backend.orphans is not None and self._answering is None:
            self._answering = asyncio.create_task(self._answer_orphans(self._backend.orphans),
                                                  name="answer orphaned jobs")
        self._subscription = await self._bus.consume(
            queue=SCRIPT_INVOKE, handler=self.handle,
            prefetch=max(self._settings.scripts_prefetch, self._settings.scripts_concurrency),
        )

    async def stop(self, *, drain_seconds: float = 0.0) -> None:
        """Stop taking requests; unfinished ones go back to the queue for another manager."""
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            await subscription.close(drain_seconds=drain_seconds)
        await self._once.cancel_all()  # their deliveries were not acked: the broker hands them on
        await cancel_and_wait(self._answering)

    async def handle(self, delivery: Delivery) -> None:
        if self.revoked is not None:
            raise _HandedBack
        sender = _answerable(delivery)
        try:
            reply = await self.answer(delivery, sender=sender)
        except _Refusal as refusal:
            await self._reply(delivery, refusal.reply)
            raise Refused(refusal.reply.error.message) from None
        if reply is not None:
            await self._reply(delivery, reply)

    async def _answer_orphans(self, orphans: asyncio.Queue[Orphan]) -> None:
        """Answer the jobs of dead manager instances, as the reaper hands them on (until cancelled)."""
        while True:
            orphan = await orphans.get()
            asker = Principal.parse(orphan.asker.user)
            if asker is None or asker.kind != "agent" or not orphan.asker.reply_to.startswith(
                    agent_replies_prefix(namespace=asker.namespace, name=asker.name)):
                log.error("the pod %s of a dead instance names %s, who cannot be answered on %s; not answering it",
                          orphan.pod, orphan.asker.user, orphan.asker.reply_to)  # only a manager writes pods
                continue
            log.warning("answering request %s of %s: the scripts-manager instance %s running it stopped",
                        orphan.request_id, orphan.asker.user, orphan.manager)
            reply = self._count(_error(request_id=orphan.request_id, code=ErrorCode.UNAVAILABLE, retryable=True,
                                       message=STOPPED))
            address = ReplyAddress(reply_to=orphan.asker.reply_to, correlation_id=orphan.asker.correlation_id)
            try:
                await self._reply(address, reply)
            except BusError as exc:
                log.warning("could not answer the orphaned request %s of %s: %s", orphan.request_id,
                            orphan.asker.user, exc)

    async def _reply(self, delivery: Delivery | ReplyAddress, reply: Reply) -> None:
        """Answer; an answer that cannot be delivered is dropped with a log line and counted, and its request is
        acked all the same (requeued, it would run again and be refused again: a hostile reply queue must not
        make the manager work for nothing)."""
        try:
            await self._bus.reply(to=delivery, body=reply)
        except NoRoute:
            self._metrics.replies_dropped.labels(reason="no_queue").inc()
            log.warning("the reply queue %s of request %s is gone; dropping its answer",
                        delivery.reply_to, reply.request_id)
        except Nacked as exc:
            self._metrics.replies_dropped.labels(reason="refused").inc()
            log.warning("the broker refused the answer to request %s from %s on %s (%s); dropping it",
                        reply.request_id, delivery.user_id, delivery.reply_to, exc)

    async def answer(self, delivery: Delivery, *, sender: Principal) -> Reply | None:
        """The answer to a request from `sender`; `_Refusal` (answered, then dead-lettered) for one to refuse; None
        for a copy of a request that another manager instance answers (or whoever cleans up after it)."""
        request_id = delivery.correlation_id or delivery.message_id or ""
        try:
            delivery.check_size(self._settings.max_request_bytes)
        except TooLarge as exc:
            raise _Refusal(self._count(_error(
                request_id=request_id, code=ErrorCode.INVALID_ARGUMENTS,
                message=f"{exc}: send a shorter script or less input_data",
            ))) from None  # fmt: skip
        try:
            request = ScriptInvokeRequest.model_validate_json(delivery.body)
        except ValidationError as exc:
            return self._count(_error(
                request_id=request_id,
                code=ErrorCode.INVALID_ARGUMENTS,
                message=_describe(exc),
            ))  # fmt: skip
        if request.agent != sender.name:
            raise _Refusal(self._count(_error(
                request_id=request.request_id, code=ErrorCode.REJECTED,
                message=f"this request comes from agent {sender.agent_id}, not {request.agent}: ask as yourself",
            )))  # fmt: skip
        fingerprint = hashlib.sha256(request.model_dump_json().encode() + b"\0" + (delivery.reply_to or "").encode())
        taken = time.time_ns()
        waited = queue_wait(delivery, now=taken / 1e9)  # the span below ends at the same moment
        key = (sender.user, request.request_id)
        new = not self._once.knows(key)  # a copy of a request taken before joins it, whatever the sender holds
        if new and self._held[sender.user] >= self._settings.scripts_queued_per_agent:
            return self._count(_error(
                request_id=request.request_id, code=ErrorCode.UNAVAILABLE, retryable=True,
                message=(f"agent {sender.agent_id} already has {self._held[sender.user]} scripts waiting or running "
                         "at this scripts-manager (ROCKBOT_SCRIPTS_QUEUED_PER_AGENT): wait for their answers, then "
                         "send this one again"),
            ))  # fmt: skip
        if new and delivery.redelivered:  # a copy of a request a manager took before: did its script start?
            match await self._taken_before(request, sender=sender):
                case Taken.RUNNING:
                    log.info("request %s of %s came back, but a sandbox runs it already: its manager (or whoever "
                             "cleans up after it) answers it", request.request_id, sender)
                    return None
                case Taken.REAPED:
                    return self._count(_error(request_id=request.request_id, code=ErrorCode.UNAVAILABLE,
                                              retryable=True, message=STOPPED))
                case ScriptInvokeError() as unknown:
                    return unknown
        if new:
            self._held[sender.user] += 1
        asker = Asker(user=sender.user, reply_to=delivery.reply_to or "",
                      correlation_id=delivery.correlation_id or request.request_id)
        acceptance = _Acceptance.of(delivery, asker=asker, taken=taken / 1e9)
        try:
            return await self._once.run(
                key=key, fingerprint=fingerprint.hexdigest(),
                work=lambda: self._run(request, sender=sender, asker=asker, waited=waited, taken=taken,
                                       acceptance=acceptance),
            )  # fmt: skip
        except Conflict:
            return self._count(_error(
                request_id=request.request_id, code=ErrorCode.REJECTED,
                message=(
                    f"request_id {request.request_id!r} of agent {request.agent!r} was already used for a different "
                    "script, input, timeout, packages or reply queue; send each new request with a fresh request_id"
                ),
            ))  # fmt: skip
        finally:
            if new:
                self._held[sender.user] -= 1
                if not self._held[sender.user]:
                    del self._held[sender.user]

    async def _taken_before(
        self, request: ScriptInvokeRequest, *, sender: Principal
    ) -> Taken | ScriptInvokeError | None:
        """What became of a redelivered request (None: no sandbox took it); an error when that cannot be told."""
        try:
            return await self._backend.taken_before(user=sender.user, request_id=request.request_id)
        except CredentialsRevoked as exc:
            self.revoke(exc)
            raise _HandedBack from None
        except SandboxUnavailable as exc:
            return self._count(_error(
                request_id=request.request_id, code=ErrorCode.UNAVAILABLE, retryable=True,
                message=f"this request came back from a scripts-manager that stopped, and whether its script "
                        f"started there cannot be told now ({exc}); it is not run, lest it run twice: check what "
                        "it did, then send it again",
            ))  # fmt: skip

    async def _run(
        self, request: ScriptInvokeRequest, *, sender: Principal, asker: Asker, waited: float | None, taken: int,
        acceptance: _Acceptance | None,
    ) -> Reply:
        """Run the request in its span (start-up, run and cleanup are the backend's child spans); until it is given
        to the backend, it is handed back if this process's credentials are revoked (`revoke`)."""
        run = asyncio.current_task()
        assert run is not None
        if self.revoked is not None:
            raise _HandedBack
        self._unstarted.add(run)
        try:
            return await self._run_in_span(request, sender=sender, asker=asker, waited=waited, taken=taken,
                                           acceptance=acceptance)
        finally:
            self._unstarted.discard(run)

    async def _run_in_span(
        self, request: ScriptInvokeRequest, *, sender: Principal, asker: Asker, waited: float | None, taken: int,
        acceptance: _Acceptance | None,
    ) -> Reply:
        backend = self._metrics.backend
        with tracer.start_as_current_span("run script") as span:
            if waited is not None:
                self._metrics.queue_wait.labels(backend).observe(waited)
                _queue_wait_span(waited, taken=taken)
            span.set_attributes({
                "rockbot.script.backend": backend, "rockbot.script.request_id": request.request_id,
                "rockbot.agent": sender.agent_id, "rockbot.script.timeout_seconds": request.timeout_seconds,
            })  # fmt: skip
            async with self._share.slot(sender.user):  # its turn: a sandbox free, under its agent's share
                reply = await self._checked_run(request, sender=sender, asker=asker, acceptance=acceptance)
            outcome = _outcome(reply)
            span.set_attribute("rockbot.script.outcome", outcome)
            if isinstance(reply, ScriptInvokeError):
                span.set_status(Status(StatusCode.ERROR, outcome))
            return reply

    async def _checked_run(
        self, request: ScriptInvokeRequest, *, sender: Principal, asker: Asker, acceptance: _Acceptance | None
    ) -> Reply:
        limits = self._limits.of(sender)
        if limits is None:
            return self._count(_error(
                request_id=request.request_id, code=ErrorCode.REJECTED,
                message=f"the scripts-manager knows no Agent {sender.agent_id}, so it has no script limits for it "
                        "(it follows the Agents of ROCKBOT_NAMESPACES)",
            ))  # fmt: skip
        try:
            job = policy.check(request=request, limits=limits, settings=self._settings, asker=asker)
        except policy.Refused as refused:
            return self._count(ScriptInvokeError(request_id=request.request_id, error=refused.error))
        if self._isolation is not None and (refusal := await self._isolation.refusal()) is not None:
            return self._count(ScriptInvokeError(request_id=request.request_id, error=refusal))
        kept_at = request.output_files if self._outputs is not None else None
        if kept_at is not None:  # its files need not fit in the answer: this manager keeps them in the console
            job = job.model_copy(update={"output_bounds": self._settings.kept_output_bounds})
        if request.input_files is not None:
            try:
                job = job.model_copy(update={"files": await self._input_files(request, sender=sender)})
            except InputsUnavailable as exc:
                code = ErrorCode.UNAVAILABLE if exc.retryable else ErrorCode.INVALID_ARGUMENTS
                return self._count(_error(request_id=request.request_id, code=code, message=str(exc),
                                          retryable=exc.retryable))  # fmt: skip
        if self.revoked is not None:
            raise _HandedBack
        keeping = self._outputs.keep_seconds if kept_at is not None and self._outputs is not None else 0.0
        if acceptance is not None and not await self._accept(acceptance, job=job, keeping=keeping):
            return self._count(_error(
                request_id=request.request_id, code=ErrorCode.UNAVAILABLE, retryable=True,
                message=f"this script was not started: its agent waits {acceptance.within:g} s for a scripts-manager "
                        "to take it, and it waited longer for a free sandbox (or came back from a scripts-manager "
                        "that stopped); send it again",
            ))  # fmt: skip
        backend = self._metrics.backend
        started = time.monotonic()
        run = asyncio.current_task()
        assert run is not None
        self._unstarted.discard(run)  # from here its answer is awaited: a revocation no longer hands it back
        self._metrics.in_flight.labels(backend).inc()
        try:
            reply: Reply = await self._backend.run(job)
        except CredentialsRevoked as exc:
            self.revoke(exc)
            if not exc.may_have_run:
                raise _HandedBack from None
            reply = _error(request_id=request.request_id, code=ErrorCode.UNAVAILABLE, retryable=True, message=STOPPED)
        except SandboxUnavailable as exc:
            reply = _error(request_id=request.request_id, code=ErrorCode.UNAVAILABLE, message=str(exc), retryable=True)
        except SandboxFailure as exc:
            reply = _error(request_id=request.request_id, code=ErrorCode.EXECUTION_FAILED, message=str(exc))
        except Exception as exc:
            log.exception("running request %s failed", request.request_id)
            reply = _error(
                request_id=request.request_id, code=ErrorCode.EXECUTION_FAILED,
                message=f"the scripts-manager failed to run the script: {type(exc).__name__}: {exc}",
            )  # fmt: skip
        finally:
            self._metrics.in_flight.labels(backend).dec()
            self._metrics.duration.labels(backend).observe(time.monotonic() - started)
        if kept_at is not None and self._outputs is not None and isinstance(reply, ScriptInvokeResponse):
            reply = await self._outputs.keep(reply, target=kept_at, agent=sender)
        return self._count(reply)

    async def _input_files(self, request: ScriptInvokeRequest, *, sender: Principal) -> tuple[InputFile, ...]:
        """The files the request names, read as its validated sender's (never as the agent it claims to be)."""
        assert request.input_files is not None
        if self._inputs is None:
            raise InputsUnavailable("input_files: this scripts-manager reads no conversation files (it has no "
                                    "console to ask); send the request without them")
        return await self._inputs.fetch(request.input_files, agent=sender)

    async def _accept(self, acceptance: _Acceptance, *, job: ScriptJob, keeping: float) -> bool:
        """Tell the asker its script starts now and is answered within its timeout plus the backend's start-up
        bound (and the time its files may take to keep); False when the asker stopped waiting for that word, or its
        reply queue is gone (nobody would read the answer)."""
        if time.time() > acceptance.by:
            return False
        try:
            await self._bus.accept(to=acceptance.address,
                                   answer_within_seconds=job.timeout_seconds + self._backend.start_seconds + keeping)
        except (NoRoute, Nacked) as exc:
            log.warning("cannot tell %s that request %s is taken (%s); not starting it", acceptance.address.reply_to,
                        job.request_id, exc)
            return False
        return True

    def revoke(self, exc: CredentialsRevoked) -> None:
        """The first refusal of this process's credentials (met by a job, or by the isolation canary): hand back every
        run not given to the backend yet (their handlers are cancelled, so the broker redelivers their messages at
        once), say so once, and tell `on_revoked`."""
        if self.revoked is not None:
            return
        self.revoked = exc
        unstarted = [run for run in self._unstarted if run is not asyncio.current_task()]
        for run in unstarted:
            run.cancel()
        log.critical("%s; this scripts-manager takes no more scripts: %d not started are handed back to the queue "
                     "for another manager, the ones running end or are answered as stopped, then it exits",
                     exc, len(unstarted))
        if self._on_revoked is not None:
            self._on_revoked(exc)

    def _count(self, reply: Reply) -> Reply:
        self._metrics.runs.labels(self._metrics.backend, _outcome(reply)).inc()
        return reply


def _outcome(reply: Reply) -> str:
    """succeeded, exited_nonzero, timed_out, oom_killed, or the error's code."""
    if isinstance(reply, ScriptInvokeError):
        return reply.error.code.value
    if reply.timed_out:
        return "timed_out"
    if reply.oom_killed:
        return "oom_killed"
    return "succeeded" if reply.exit_code == 0 else "exited_nonzero"


def _queue_wait_span(waited: float, *, taken: int) -> None:
    """The time the request spent in `script.invoke`, as a span of its own ending when this manager took it.

    `taken` (ns since the epoch) is stamped on delivery, not when the run begins: on a busy manager the two
    differ, and a span drawn back from the later one would start after the send and end after the take.
    """
    tracer.start_span("queue wait", start_time=taken - int(waited * 1e9)).end(end_time=taken)


@dataclass(frozen=True)
class _Acceptance:
    """Where to say a request is taken, and until when (seconds since the epoch) its asker waits for that."""

    address: ReplyAddress
    within: float
    by: float

    @classmethod
    def of(cls, delivery: Delivery, *, asker: Asker, taken: float) -> _Acceptance | None:
        """None when the request does not ask. Its wait began when it was sent (the sender's stamp, on a clock
        that may differ a little from ours), and never later than when it reached this manager."""
        within = delivery.accept_within_seconds
        if within is None:
            return None
        sent = min(taken, delivery.published_at or taken)
        return cls(address=ReplyAddress(reply_to=asker.reply_to, correlation_id=asker.correlation_id), within=within,
                   by=sent + within)


class _HandedBack(asyncio.CancelledError):
    """Raised in a request's handler (or its run) to give its delivery back: the bus hands a cancelled handler's
    message back to the queue at once, unacked, for another consumer."""


class _Refusal(Exception):
    """A request answered with an error and then dead-lettered (it claims too much, or is too large)."""

    def __init__(self, reply: ScriptInvokeError) -> None:
        super().__init__(reply.error.message)
        self.reply = reply


def _answerable(delivery: Delivery) -> Principal:
    """The agent that sent `delivery`, when its `reply_to` is one of that agent's own queues; else `Refused`."""
    sender = delivery.agent_answered_on_own(lambda agent: agent_replies_prefix(namespace=agent.namespace,
                                                                               name=agent.name))  # fmt: skip
    if sender is None:
        raise Refused(
            f"a script request is answered only on one of its agent's own agent.<namespace>.<agent>.replies.* queues; "
            f"{delivery.user_id} asked for {delivery.reply_to or ''!r}, so it can never be answered"
        )
    return sender


def _error(*, request_id: str, code: ErrorCode, message: str, retryable: bool = False) -> ScriptInvokeError:
    return ScriptInvokeError(request_id=request_id, error=ErrorInfo(code=code, message=message, retryable=retryable))


def _describe(exc: ValidationError) -> str:
    problems = [f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5]]
    return "not a valid script request: " + "; ".join(problems)
