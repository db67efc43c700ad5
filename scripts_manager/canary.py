"""The isolation canary of script sandboxes: prove by trying that a script reaches none of its targets.

The canary is a script like any other, run on the manager's own backend: with pods, a pod made by the
same builder as every script pod (namespace, labels, security context, image, runtime class, the
namespace's NetworkPolicies), so what it reaches a script can reach. Its program (`rockbot.reach_probe`)
tries every target of ROCKBOT_SCRIPTS_ISOLATION_TARGETS (TCP connects and DNS queries, a few seconds
each, all at once); names in `tcp://` targets are resolved by the manager first, so a blocked DNS
cannot hide an open route. The local sandbox tries a TCP listener and a DNS responder the manager
opens on 127.0.0.1 for the run: reaching either means the sandbox shares the host's network.

It runs at start-up, then every ROCKBOT_SCRIPTS_ISOLATION_INTERVAL_SECONDS, and (pods) after the scripts
namespace's NetworkPolicies change (`policy_watch.py`; changes within ROCKBOT_SCRIPTS_ISOLATION_DEBOUNCE_SECONDS
of each other are one proof). The pod template comes from the settings, so a changed template is a new
manager, whose start-up runs it again. The last proof is the `EgressRestricted` condition of `/readyz`,
the gauges `rockbot_isolation_reachable` and `rockbot_isolation_last_proof_timestamp_seconds`, and
(pods) an Event on the scripts namespace per proof, its proof as JSON in an annotation
(`PROOF_ANNOTATION`) for `rockbot status`. Fail closed: while the last canary reached anything, or
could not run, scripts are refused naming what was reached and the fix, unless
ROCKBOT_SCRIPTS_ISOLATION_ENFORCE=false (then they run and every canary logs a warning). A request
that arrives before the first proof waits for it. A canary that could not run (its pod unschedulable on a full
node, the API unreachable) is tried again after RETRY_FIRST_SECONDS, doubling up to RETRY_MAX_SECONDS, not after
the interval: scripts wait for it, and are told when the next try is.

Its pod asks for `cpu` (the pod backend: ROCKBOT_SCRIPTS_ISOLATION_CPU, 100m, or the scripts' own CPU when that is
less), not for a script's CPU: its probe needs next to nothing, and it must find room on a node whose script pods
take all the rest. Scripts wait for the first proof, so a canary that cannot be scheduled stops all scripts: on
the 2-CPU e2e node, after a scripts-manager pod was force-deleted, the pods of its jobs (500m each, left running
until the new manager reaped them once the dead one's Lease expired, 15 s) kept the new manager's canary Pending
("Insufficient cpu") for 15 s, so every script sent meanwhile was not taken within its agent's 15 s
(docs/operations/crashes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from rockbot.conditions import ConditionUpdate
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.reachability import (
    CONDITION,
    ENFORCE_FIX,
    PROBE,
    PROBE_TIMEOUT_SECONDS,
    PROOF_ANNOTATION,
    IsolationMetrics,
    Proof,
    PublishedProof,
    Targets,
    findings,
    now,
    probe_input,
)
from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable, ScriptBackend, ScriptJob
from rockbot.tasks import cancel_and_wait
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

#: Posts an Event about the proof: (type, reason, message, annotations).
PostEvent = Callable[[str, str, str, dict[str, str]], Awaitable[None]]
#: What the local sandbox needs when its canary reached the host.
LOCAL_FIX = (
    "the local sandbox shares this host's network: install bubblewrap (apt-get install -y bubblewrap) and leave "
    "ROCKBOT_SCRIPTS_LOCAL_ISOLATION at auto"
)
#: The canary's own bound on a run once its sandbox is up (the probe's timeout, the runner's answer).
CANARY_SECONDS = PROBE_TIMEOUT_SECONDS + 10.0
#: How long the first proof waits for the first list of what would make it stale (ChangeWatch.listed).
LISTED_SECONDS = 10.0
#: After a canary that could not run, the next comes after this, doubling each time up to RETRY_MAX_SECONDS.
RETRY_FIRST_SECONDS = 5.0
RETRY_MAX_SECONDS = 60.0


class ChangeWatch(Protocol):
    """Something whose changes make the last proof stale (the scripts namespace's NetworkPolicies)."""

    listed: asyncio.Event

    async def run(self, on_change: Callable[[str], None]) -> None: ...


class IsolationCanary:
    """Runs the canary on a backend, keeps the last proof, and says whether scripts may run."""

    def __init__(
        self,
        *,
        backend: ScriptBackend,
        targets: Callable[[], contextlib.AbstractAsyncContextManager[Targets]],
        enforce: bool,
        interval_seconds: float,
        metrics: IsolationMetrics,
        first_proof_seconds: float,
        sandboxes: str = "script pods",
        fix: str = ENFORCE_FIX,
        post_event: PostEvent | None = None,
        changes: ChangeWatch | None = None,
        debounce_seconds: float = 0.0,
        cpu: str | None = None,
    ) -> None:
        self._sandboxes = sandboxes
        self._fix = fix
        self._backend = backend
        self._targets = targets
        self.enforce = enforce
        self._interval = interval_seconds
        self._metrics = metrics
        self._first_proof_seconds = first_proof_seconds
        self._post_event = post_event
        self._changes = changes
        self._debounce = debounce_seconds
        self._cpu = cpu
        self.last: Proof | None = None
        self._proven = asyncio.Event()
        self._again = asyncio.Event()
        self._why = ""
        self._next_at: float | None = None  # when the next canary runs (the loop's clock); None: one runs now

    async def run(self) -> None:
        """Run the canary now, then every interval and after each change `changes` reports, until cancelled."""
        watching = None
        try:
            if self._changes is not None:
                watching = asyncio.create_task(self._changes.run(self.again), name="isolation canary's change watch")
                with contextlib.suppress(TimeoutError):  # a change after the list is seen, so none is missed
                    async with asyncio.timeout(LISTED_SECONDS):
                        await self._changes.listed.wait()
            failed = 0
            while True:
                proof = await self.run_once()
                failed = failed + 1 if proof.error is not None else 0
                why = await self._next(retry_wait(failed) if failed else self._interval)
                log.info("isolation canary again: %s", why)
        finally:
            await cancel_and_wait(watching)

    def again(self, why: str) -> None:
        """Prove again soon: something that may open or close a route changed. Changes less than
        `debounce_seconds` apart are one proof (a `helm upgrade` rewriting several policies)."""
        self._why = why
        self._again.set()

    async def _next(self, seconds: float) -> str:
        """Why to prove again: `seconds` passed, or a change followed by a quiet `debounce_seconds`."""
        self._next_at = asyncio.get_running_loop().time() + seconds
        try:
            async with asyncio.timeout(seconds):
                await self._again.wait()
        except TimeoutError:
            return f"{seconds:g} s since the last {'proof' if seconds == self._interval else 'try'}"
        finally:
            self._next_at = None
        while True:  # a change from here on asks for the proof after this one
            self._again.clear()
            try:
                async with asyncio.timeout(self._debounce):
                    await self._again.wait()
            except TimeoutError:
                return self._why

    async def run_once(self) -> Proof:
        async with self._targets() as targets:
            proof = await self._try(targets) if any(targets.values()) else Proof(at=now())
        self.last = proof
        self._proven.set()
        self._metrics.record(proof)
        update = self._describe(proof)
        if proof.off:
            log.warning("isolation canary: %s", update.message)
        elif proof.isolated:
            log.info("isolation canary: %s", update.message)
        elif self.enforce:
            log.error("isolation canary: %s; scripts are refused until a canary proves isolation", update.message)
        else:
            log.warning("isolation canary: %s; scripts run anyway (ROCKBOT_SCRIPTS_ISOLATION_ENFORCE=false)",
                        update.message)
        if self._post_event is not None:  # every proof: `rockbot status` reads the last one
            published = PublishedProof.of(proof, update, enforce=self.enforce, interval_seconds=self._interval)
            await self._post_event("Normal" if proof.isolated and not proof.off else "Warning", _reason(proof),
                                   update.message, {PROOF_ANNOTATION: published.model_dump_json()})
        return proof

    async def _try(self, targets: Targets) -> Proof:
        job = ScriptJob(request_id=f"isolation-canary-{secrets.token_hex(4)}", script=PROBE,
                        input_data=probe_input(targets), timeout_seconds=CANARY_SECONDS, cpu=self._cpu)
        try:
            with tracer.start_as_current_span("isolation canary"):  # a trace of its own, not three loose steps
                answer = await self._backend.run(job)
        except (SandboxUnavailable, SandboxFailure) as exc:
            return Proof(at=now(), error=str(exc))
        if not isinstance(answer, ScriptInvokeResponse) or answer.exit_code != 0:
            return Proof(at=now(), error=f"the canary's program failed: {_said(answer)}")
        try:
            return Proof(at=now(), findings=findings(answer.stdout, targets=targets))
        except ValueError as exc:
            return Proof(at=now(), error=str(exc))

    def condition(self) -> ConditionUpdate:
        if self.last is None:
            return ConditionUpdate(type=CONDITION, status="Unknown", reason="CanaryPending",
                                   message="the first isolation canary has not finished yet")
        return self._describe(self.last)

    def _describe(self, proof: Proof) -> ConditionUpdate:
        return proof.condition(pods=self._sandboxes, fix=self._fix)

    def not_ready(self) -> str | None:
        """For /readyz: why scripts are refused (enforced and not proven), else None."""
        if not self.enforce or (self.last is not None and self.last.isolated):
            return None
        return f"isolation: {self.condition().message}"

    async def first_proof(self) -> Proof | None:
        """The last proof, once the first canary has finished (None if it did not within its bound)."""
        if self.last is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._first_proof_seconds):
                    await self._proven.wait()
        return self.last

    async def refusal(self) -> ErrorInfo | None:
        """None when a script may run; else why not, naming what was reached and the fix."""
        proof = await self.first_proof()
        if proof is not None and proof.isolated:
            return None
        if not self.enforce:
            log.warning("running a script although isolation is not proven (%s): ROCKBOT_SCRIPTS_ISOLATION_ENFORCE"
                        "=false", self.condition().message)
            return None
        fix = (" (or, accepting the risk, set scripts.isolation.enforce=false in the chart: "
               "ROCKBOT_SCRIPTS_ISOLATION_ENFORCE=false)")
        if proof is None or proof.error is not None:
            return ErrorInfo(code=ErrorCode.UNAVAILABLE, retryable=True,
                             message=f"scripts wait for the isolation canary: {self.condition().message}"
                                     f"{self._when_next() if proof is not None else ''}{fix}")
        return ErrorInfo(code=ErrorCode.REJECTED, message=f"scripts are refused: {self.condition().message}{fix}")


    def _when_next(self) -> str:
        """When the next canary runs, for a refusal: try again after that."""
        if self._next_at is None:
            return "; a canary runs now"
        return f"; the next canary runs in {max(self._next_at - asyncio.get_running_loop().time(), 0):.0f} s"


def retry_wait(failed: int) -> float:
    """Seconds before the next canary after `failed` in a row could not run: RETRY_FIRST_SECONDS, doubling."""
    return min(RETRY_FIRST_SECONDS * 2 ** (failed - 1), RETRY_MAX_SECONDS)


def _reason(proof: Proof) -> str:
    if proof.error is not None:
        return "IsolationCanaryFailed"
    if proof.off:
        return "IsolationCanaryOff"
    return "IsolationBreached" if proof.reached else "IsolationProven"


def _said(answer: object) -> str:
    if isinstance(answer, ScriptInvokeResponse):
        return f"exit code {answer.exit_code}, timed out {answer.timed_out}: {answer.stderr.strip()[-300:]}"
    return str(answer)


@contextlib.asynccontextmanager
async def resolved(targets: Targets) -> AsyncIterator[Targets]:
    """`targets` with the names of `tcp://` targets resolved here, so the canary tests the route, not its DNS.

    A name that does not resolve is kept as it is (the canary then tries, and fails, to resolve it).
    """
    loop = asyncio.get_running_loop()
    out: Targets = {}
    for probe, uris in targets.items():
        out[probe] = []
        for uri in uris:
            parts = urllib.parse.urlsplit(uri)
            if parts.scheme == "tcp" and parts.hostname:
                with contextlib.suppress(OSError):
                    infos = await loop.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM)
                    address = infos[0][4][0]
                    uri = f"tcp://{f'[{address}]' if ':' in address else address}:{parts.port}"
            out[probe].append(uri)
    yield out


@contextlib.asynccontextmanager
async def host_listeners(*, host: str = "127.0.0.1", tcp_port: int = 0, dns_port: int = 0) -> AsyncIterator[Targets]:
    """A TCP listener and a DNS responder on `host` (this host's loopback for a local run), while in use."""
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(_hang_up, host=host, port=tcp_port)
    transport, _ = await loop.create_datagram_endpoint(_DnsResponder, local_addr=(host, dns_port))
    try:
        tcp_port = server.sockets[0].getsockname()[1]
        dns_port = transport.get_extra_info("sockname")[1]
        yield {"host": [f"tcp://{host}:{tcp_port}", f"dns://{host}:{dns_port}/canary.rockbot.invalid"]}
    finally:
        transport.close()
        server.close()
        await server.wait_closed()


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


class _DnsResponder(asyncio.DatagramProtocol):
    """Answers every query with its own id and "no such name": enough to show the query arrived."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) >= 12:
            self._transport.sendto(data[:2] + struct.pack("!HHHHH", 0x8183, 1, 0, 0, 0) + data[12:], addr)  # type: ignore[attr-defined]
