"""The scripts-manager's consumer: take a request from `script.invoke`, run it, reply, then ack.

Every request is answered: a body that is not a valid request gets InvalidArguments naming the
field, policy refusals get their code, sandbox trouble gets Unavailable/ExecutionFailed.

A request is known by its agent and request id together (another agent's same id is another
request). It is run at most once while it is in flight: a redelivered or duplicated copy waits for
the same run, and a copy arriving shortly after it finished (the manager died between replying and
acking) gets the remembered answer instead of running the script again. A request that reuses an
agent's request id with a different body (script, input, timeout or packages) is answered
Rejected rather than run: a request id is a tool-call id and is never reused honestly, and running
it would put two different answers under one correlation id.

A run outlives its delivery (see `RunOnce`): a delivery cancelled because the broker connection
was lost leaves the script running, and the copy the broker redelivers joins it. Only `stop()`
cancels runs.
"""

from __future__ import annotations

import hashlib
import logging
import time

from pydantic import ValidationError

from rockbot.bus import Bus, Delivery, NoRoute, Subscription
from rockbot.bus.once import Conflict, RunOnce
from rockbot.bus.topology import SCRIPT_INVOKE
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager import policy
from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable, ScriptBackend
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import ScriptsManagerSettings

log = logging.getLogger(__name__)

Reply = ScriptInvokeResponse | ScriptInvokeError


class ScriptService:
    def __init__(
        self, *, bus: Bus, backend: ScriptBackend, settings: ScriptsManagerSettings, metrics: ScriptMetrics
    ) -> None:
        self._bus = bus
        self._backend = backend
        self._settings = settings
        self._metrics = metrics
        self._once: RunOnce[Reply] = RunOnce()  # keyed by (agent, request id)
        self._subscription: Subscription | None = None

    @property
    def consuming(self) -> bool:
        return self._subscription is not None

    async def start(self) -> None:
        self._subscription = await self._bus.consume(
            queue=SCRIPT_INVOKE, handler=self.handle, prefetch=self._settings.scripts_concurrency
        )

    async def stop(self, *, drain_seconds: float = 0.0) -> None:
        """Stop taking requests; unfinished ones go back to the queue for another manager."""
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            await subscription.close(drain_seconds=drain_seconds)
        await self._once.cancel_all()  # their deliveries were not acked: the broker hands them on

    async def handle(self, delivery: Delivery) -> None:
        reply = await self.answer(delivery)
        try:
            await self._bus.reply(to=delivery, body=reply)
        except NoRoute:
            log.warning("the reply queue %s of request %s is gone; dropping its answer",
                        delivery.reply_to, reply.request_id)

    async def answer(self, delivery: Delivery) -> Reply:
        try:
            request = ScriptInvokeRequest.model_validate_json(delivery.body)
        except ValidationError as exc:
            return self._count(_error(
                request_id=delivery.correlation_id or delivery.message_id or "",
                code=ErrorCode.INVALID_ARGUMENTS,
                message=_describe(exc),
            ))  # fmt: skip
        fingerprint = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
        try:
            return await self._once.run(
                key=(request.agent, request.request_id), fingerprint=fingerprint, work=lambda: self._run(request)
            )
        except Conflict:
            return self._count(_error(
                request_id=request.request_id, code=ErrorCode.REJECTED,
                message=(
                    f"request_id {request.request_id!r} of agent {request.agent!r} was already used for a different "
                    "script, input, timeout or packages; send each new request with a fresh request_id"
                ),
            ))  # fmt: skip

    async def _run(self, request: ScriptInvokeRequest) -> Reply:
        try:
            job = policy.check(request=request, settings=self._settings)
        except policy.Refused as refused:
            return self._count(ScriptInvokeError(request_id=request.request_id, error=refused.error))
        backend = self._metrics.backend
        started = time.monotonic()
        self._metrics.in_flight.labels(backend).inc()
        try:
            reply: Reply = await self._backend.run(job)
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
        return self._count(reply)

    def _count(self, reply: Reply) -> Reply:
        if isinstance(reply, ScriptInvokeError):
            outcome = reply.error.code.value
        elif reply.timed_out:
            outcome = "timed_out"
        elif reply.oom_killed:
            outcome = "oom_killed"
        else:
            outcome = "succeeded" if reply.exit_code == 0 else "exited_nonzero"
        self._metrics.runs.labels(self._metrics.backend, outcome).inc()
        return reply


def _error(*, request_id: str, code: ErrorCode, message: str, retryable: bool = False) -> ScriptInvokeError:
    return ScriptInvokeError(request_id=request_id, error=ErrorInfo(code=code, message=message, retryable=retryable))


def _describe(exc: ValidationError) -> str:
    problems = [f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5]]
    return "not a valid script request: " + "; ".join(problems)
