"""A conversation's pod kept between calls (`scriptSessions: PerConversation`), in the pod backend.

A session is one script pod, the same as a single script's (network-less, the Agent's `scriptLimits`, Pod Security
`restricted`), whose runner became kernel.py (the local sandbox's persistent interpreter): the session's first call
takes a warm pod (or makes one, cold) and writes the runner a job carrying kernel.py's source; the runner says the
job started and runs kernel.py's supervisor itself (still PID 1, non-dumpable), which starts the kernel. The attach
session that wrote that job stays open for the session's life: each later call is one line written on it and the
output read back up to the call's marker, with no pod start and no new attach. Between calls the session gets a
blank line every _KEEPALIVE_SECONDS (the kernel skips it) so that a kubelet's idle-stream timeout never closes it.

Files travel as a single script's do, with the runner's code (kernel.py): the first call's files go under /input with
the job; a later call sends only the files its session's /input lacks or holds in another version (by content
digest), as raw bytes after its line, and names those it no longer has, which the kernel removes, so /input holds the
call's files. The kernel empties /output before each call and reads it after (output_walk.py, the call's bounds),
so a call gives back what it wrote, and `plt.show()` saves there as in a single script's pod; the files come in the
kernel's line after the call's marker and are checked as a runner's are (`outputs.received`).

Since the pod's stdin is `stdinOnce`, the attach session is the session: whatever ends it (the manager stops, the
stream breaks) ends the kernel and the pod. The session's end (sessions.py) deletes its pod. A script that ends its
interpreter (`os._exit`, a signal to itself or to every process it may signal), the memory limit and the call's
timeout (on the manager's clock; the pod is deleted, a session cannot be interrupted halfway and kept) end it too,
and that call says `ended`; the pod's end state tells an OOM kill. A session lives its Agent's `maxSeconds`, or what
its warm pod had left of ROCKBOT_SCRIPTS_POOL_POD_LIFETIME_SECONDS when claimed if that is less.

Crash safety is the pod backend's own (reaping.py): the pod carries this manager instance's id, and while a call
runs, the request's key and its asker (patched on as each call starts, taken off 2 s after its answer unless the next
call's marks replace them first), so that when this instance dies, whoever is alive deletes the pod and answers the
call, and a copy of the request the broker redelivers is not run again. The mark is not waited for (the API server's
write was most of a later call's time, up to 200 ms at p95 on the loaded rig): a manager dying in the milliseconds
before it lands leaves that call to its agent's own bound, and the redelivered copy may run again, in a new session,
which says so. That costs nothing a single script's rerun would: a session pod has no network, and its state is gone
with it. A mark the API refuses is logged, and the call runs.

One manager holds a session (the one whose attach it is). With more than one replica, a call of the conversation
that reaches another replica finds the session's pod by its label (`SESSION_LABEL`, from the sender and the
conversation digest), deletes it and opens a new session, which says `restarted`: never two live sessions of one
conversation, never silently fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp
from opentelemetry import trace

from rockbot.contracts.scripts import OUTPUT_DIR, ScriptInvokeResponse
from rockbot.kube import PODS, ApiError, NotFound
from rockbot.kube.attach import STDOUT, AttachSession
from rockbot.scripts_manager.backends import (
    InputFile,
    SandboxFailure,
    SandboxUnavailable,
    ScriptJob,
    SessionTerms,
    outputs,
)
from rockbot.scripts_manager.backends.pod_jobs import (
    OutputTooLarge,
    RunnerOutput,
    job_line,
    new_nonce,
    output_limit,
    write_files,
)
from rockbot.scripts_manager.backends.pod_manifests import (
    CONTAINER,
    DEADLINE_ANNOTATION,
    DEADLINE_SLACK_SECONDS,
    SANDBOX_SELECTOR,
    SESSION_LABEL,
    call_marks_patch,
    job_pod,
    now_utc,
    session_key,
)
from rockbot.scripts_manager.backends.pool import Held
from rockbot.scripts_manager.backends.sessions import (
    KERNEL,
    KernelStream,
    Session,
    Sessions,
    call_line,
    kernel_answer,
)
from rockbot.scripts_manager.settings import ScriptsManagerSettings

if TYPE_CHECKING:
    from rockbot.scripts_manager.backends.pods import PodBackend

log = logging.getLogger(__name__)

K8sObject = dict[str, Any]
#: A held session's keepalive, as the warm pool's (pool.py).
_KEEPALIVE_SECONDS = 60.0
#: How long the pod's end state is awaited after its kernel died (the kubelet reports it on its next relist).
_END_STATE_SECONDS = 5.0
_OOM_EXIT_CODE = 137
#: How long after its answer a call's marks stay on the pod (a dead manager's reaper would answer it again).
_UNMARK_SECONDS = 2.0


class _NeverStarted(Exception):
    """The pod's runner did not become a session's kernel: the first call may go to another pod."""


class _PodSession(Session):
    def __init__(
        self, *, terms: SessionTerms, shape: tuple[object, ...], life: float, name: str,
        attach: AttachSession, reading: asyncio.Task[None], out: KernelStream, err: KernelStream,
        files: dict[str, str],
    ) -> None:  # fmt: skip
        super().__init__(terms=terms, shape=shape, max_seconds=life)
        self.files = files  # what its /input holds: name, and the content's digest
        self.name = name
        self.attach = attach
        self.reading = reading  # reads the attach session until it ends: done, the session is gone
        self.out, self.err = out, err
        self.writing = asyncio.Lock()
        self.written = time.monotonic()
        self.marking: asyncio.Task[None] | None = None
        self.unmarking: asyncio.Task[None] | None = None
        self.unmark_sent = False
        self.stopped = False
        self.pod_ends = self.started + life  # its pod's deadline, less the slack

    def gone(self) -> bool:
        return self.reading.done()

    def lasts(self, job: ScriptJob) -> bool:
        return time.monotonic() + job.timeout_seconds < self.pod_ends


class PodSessions(Sessions[_PodSession]):
    """The pod backend's sessions: one pod per (sender, conversation), kept between calls on one attach session."""

    def __init__(self, *, backend: PodBackend, settings: ScriptsManagerSettings) -> None:
        super().__init__(settings=settings)
        self._backend = backend
        self._namespace = settings.scripts_namespace
        self._background: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await super().close()
        if self._background:
            await asyncio.wait(self._background)

    async def _open(self, job: ScriptJob, *, shape: tuple[object, ...]) -> tuple[_PodSession, bool]:
        backend = self._backend
        terms = job.session
        assert terms is not None
        replaced = await self._end_elsewhere(terms)
        trace.get_current_span().add_event("looked for the session elsewhere")
        if backend.pool is not None:
            async with contextlib.aclosing(backend.pool.claims(job)) as claims:
                async for name in claims:
                    trace.get_current_span().add_event("claimed")
                    try:
                        return await self._start(name=name, job=job, shape=shape, warm=True), replaced
                    except _NeverStarted as exc:
                        log.info("warm pod %s did not start a session (%s); trying another", name, exc)
        pod = job_pod(job=job, settings=self._settings, now=now_utc(), manager=backend.reaper.instance)
        name = pod["metadata"]["name"]
        backend.reaper.in_use.add(name)
        try:
            created = await backend.create_pod(pod)
        except BaseException:
            backend.reaper.in_use.discard(name)
            raise
        try:
            return await self._start(name=name, job=job, shape=shape, warm=False, pod=created), replaced
        except _NeverStarted as exc:
            backend.delete_soon(name)
            raise SandboxFailure(f"the session pod {name} did not start its interpreter: {exc}") from None
        except BaseException:
            backend.delete_soon(name)
            raise

    async def _end_elsewhere(self, terms: SessionTerms) -> bool:
        """Delete this conversation's session pods that another manager (or an earlier instance) holds; True if any
        was: the conversation's session is restarted, not new."""
        try:
            listed = await self._backend.kube.list(
                PODS, namespace=self._namespace,
                label_selector=f"{SANDBOX_SELECTOR},{SESSION_LABEL}={session_key(terms.key)}",
            )  # fmt: skip
        except (ApiError, aiohttp.ClientError, OSError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API did not answer: {exc}") from exc
        for pod in listed.items:
            log.info("ending session pod %s of %s, held elsewhere: its conversation's call came here",
                     pod["metadata"]["name"], terms.owner)  # fmt: skip
            with contextlib.suppress(NotFound):
                await self._backend.kube.delete(PODS, namespace=self._namespace, name=pod["metadata"]["name"],
                                                grace_period_seconds=0)  # fmt: skip
        return bool(listed.items)

    async def _start(
        self, *, name: str, job: ScriptJob, shape: tuple[object, ...], warm: bool, pod: K8sObject | None = None
    ) -> _PodSession:
        """Turn the runner of pod `name` (claimed, or made for this job) into the session's kernel."""
        backend = self._backend
        terms = job.session
        assert terms is not None
        backend.reaper.in_use.add(name)
        held: Held | None = None
        try:
            if warm:
                assert backend.pool is not None
                pod = await backend.warm_started(name)
                if pod is None or not _running(pod):
                    raise _NeverStarted("it ended, or went, before its runner started")
                trace.get_current_span().add_event("pod container running")
                held = await backend.pool.take(name)
            else:
                assert pod is not None
                pod = await backend.started(pod)
                if not _running(pod):
                    raise _NeverStarted("it ended before it ran")
        except BaseException:
            if warm:
                backend.delete_soon(name)
            raise
        out, err = KernelStream(), KernelStream()
        limit = output_limit(self._settings.scripts_max_output_bytes, job.output_bounds)
        handshake = RunnerOutput(nonce=new_nonce(), limit=limit)
        opened: asyncio.Future[AttachSession] = asyncio.get_running_loop().create_future()
        took = asyncio.Event()
        reading = asyncio.create_task(self._read(name=name, held=held, opened=opened, handshake=handshake, took=took,
                                                 out=out, err=err), name=f"read session pod {name}")  # fmt: skip
        try:
            async with asyncio.timeout(self._settings.scripts_pod_start_seconds):
                await asyncio.wait({opened, reading}, return_when=asyncio.FIRST_COMPLETED)
                if not opened.done():
                    raise _NeverStarted(f"attach refused: {_failure(reading)}")
                attach = opened.result()
                # The first call's files go under /input with the job, as a single script's do; its script and input
                # are the first call's, sent to the kernel once it runs.
                await attach.write(job_line(job=job.model_copy(update={"script": "", "input_data": None}),
                                            nonce=handshake.nonce, kernel=KERNEL,
                                            max_output_bytes=self._settings.scripts_max_output_bytes))  # fmt: skip
                await write_files(attach, job)
                trace.get_current_span().add_event("job written")
                waiting = asyncio.ensure_future(took.wait())
                await asyncio.wait({waiting, reading}, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
            trace.get_current_span().add_event("script started")
            if not handshake.started or handshake.result is not None:  # an older runner ran the empty script
                raise _NeverStarted(f"its runner did not take the session ({_failure(reading) or 'it ran a job'})")
        except (TimeoutError, ApiError, aiohttp.ClientError, OSError, _NeverStarted) as exc:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading
            backend.delete_soon(name)
            if isinstance(exc, _NeverStarted):
                raise
            raise _NeverStarted(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            reading.cancel()
            backend.delete_soon(name)
            raise
        return _PodSession(terms=terms, shape=shape, life=_life_left(pod), name=name, attach=attach,
                           reading=reading, out=out, err=err, files=await _digests(job.files))  # fmt: skip

    async def _read(
        self, *, name: str, held: Held | None, opened: asyncio.Future[AttachSession], handshake: RunnerOutput,
        took: asyncio.Event, out: KernelStream, err: KernelStream,
    ) -> None:  # fmt: skip
        """Read the pod's attach session (the one the pool held to it, or a new one) until it ends: first the
        runner's word that it took the session, then the kernel's two streams."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                if held is not None and held.session is not None:
                    attach = held.session
                else:
                    attach = await stack.enter_async_context(
                        self._backend.kube.attach(namespace=self._namespace, name=name, container=CONTAINER))
                opened.set_result(attach)
                async for piece in attach:
                    if not took.is_set():
                        if piece.channel == STDOUT:
                            handshake.feed(piece.data)
                            if handshake.started:
                                took.set()
                        continue
                    (out if piece.channel == STDOUT else err).feed(piece.data)
        except (ApiError, aiohttp.ClientError, OSError, OutputTooLarge) as exc:
            log.info("the session pod %s's attach session ended: %r", name, exc)
            if not opened.done():
                opened.set_exception(exc)
        finally:
            if held is not None:
                held.released.set()
            out.closed.set()
            err.closed.set()

    async def _call(self, session: _PodSession, job: ScriptJob) -> ScriptInvokeResponse:
        if session.answered:  # the first call's marks came with the pod's claim or creation
            session.marking = self._spawn(self._mark(session, job), name=f"mark session pod {session.name}")
        cap = self._settings.scripts_max_output_bytes
        files = await _digests(job.files)
        sent = tuple(file for file in job.files if session.files.get(file.name) != files[file.name])
        line, marker = call_line(job, input_files=[[file.name, len(file.content)] for file in sent],
                                 input_removed=sorted(session.files.keys() - files.keys()),
                                 output_bounds=list(job.output_bounds))  # fmt: skip
        session.files = files
        session.out.begin(marker=marker, cap=cap, trailer=output_limit(cap, job.output_bounds))
        session.err.begin(marker=marker, cap=cap)
        started = time.monotonic()
        answered = asyncio.ensure_future(asyncio.gather(session.out.ended.wait(), session.err.ended.wait()))
        try:
            await self._write(session, line, job.model_copy(update={"files": sent}))
        except (aiohttp.ClientError, ConnectionError) as exc:  # the stream broke: the session is gone
            log.info("writing a call to session pod %s failed: %r", session.name, exc)
        trace.get_current_span().add_event("call written")
        done, _ = await asyncio.wait({answered, session.reading}, timeout=job.timeout_seconds,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        duration = time.monotonic() - started
        timed_out = not done
        exit_code, oom = None, False
        collected = outputs.Collected((), ())
        if answered in done:
            exit_code = session.out.exit_code()
            collected = await self._collected(session, job)
        else:
            answered.cancel()
            answered.add_done_callback(lambda gathered: gathered.cancelled() or gathered.exception())
            if not timed_out:  # the kernel died (its script, the memory limit): its pod's end state says how
                exit_code, oom = await self._how_it_ended(session.name)
            self._stop(session)
            with contextlib.suppress(asyncio.CancelledError):
                await session.reading
        trace.get_current_span().add_event("answered")
        self._unmark_soon(session)
        self._backend.metrics.pod_duration.labels("session").observe(time.monotonic() - started)
        return kernel_answer(job, out=session.out, err=session.err, exit_code=exit_code, timed_out=timed_out,
                             oom_killed=oom, duration_seconds=round(duration, 4), backend=self._backend.name,
                             pod=session.name, artifacts=collected.artifacts,
                             artifacts_dropped=collected.dropped)  # fmt: skip

    async def _collected(self, session: _PodSession, job: ScriptJob) -> outputs.Collected:
        """The call's files from the kernel's line after its marker, checked as a runner's are; a line that breaks
        the protocol (only the script, in the kernel's process, could write one) ends the session, and says so."""
        trailer = session.out.trailer()
        try:
            if session.out.overflowed or "exit_code" not in trailer:
                raise ValueError("the line after its marker was not the kernel's")
            return outputs.received(trailer.get("artifacts", []), trailer.get("artifacts_dropped", []),
                                    bounds=job.output_bounds)  # fmt: skip
        except ValueError as exc:
            log.warning("session pod %s broke its kernel's protocol: %s", session.name, exc)
            self._stop(session)
            with contextlib.suppress(asyncio.CancelledError):
                await session.reading
            return outputs.Collected((), (f"{OUTPUT_DIR}: nothing came back ({exc}), and the session was ended",))

    async def _write(self, session: _PodSession, data: bytes, job: ScriptJob | None = None) -> None:
        """Write `data` (a call's line, or a keepalive) on the session's stream, and the files of `job` after it."""
        async with session.writing:
            await session.attach.write(data)
            if job is not None:
                await write_files(session.attach, job)
            session.written = time.monotonic()

    async def _mark(self, session: _PodSession, job: ScriptJob) -> None:
        """Mark the pod with this call as it starts (see the module's docstring). The last call's unmark, if not sent
        yet, is not sent at all (this mark replaces its marks); if sent, it is waited for."""
        if session.unmarking is not None:
            if not session.unmark_sent:
                session.unmarking.cancel()
            await asyncio.wait({session.unmarking})
        await self._patch(session.name, call_marks_patch(job))

    def _unmark_soon(self, session: _PodSession) -> None:
        """Take the call's marks off the pod after _UNMARK_SECONDS, unless the next call's replace them first (a
        conversation's calls often come back to back: one PATCH each, not two)."""
        session.unmark_sent = False

        async def unmark() -> None:
            if session.marking is not None:  # its mark first, or the unmark could land before it
                await asyncio.wait({session.marking})
            await asyncio.sleep(_UNMARK_SECONDS)
            session.unmark_sent = True
            await self._patch(session.name, call_marks_patch(None))

        session.unmarking = self._spawn(unmark(), name=f"unmark session pod {session.name}")

    async def _patch(self, name: str, patch: K8sObject) -> None:
        try:
            await self._backend.kube.patch(PODS, namespace=self._namespace, name=name, body=patch)
        except NotFound:
            return  # the pod is gone: the call finds its session gone
        except (ApiError, aiohttp.ClientError, OSError) as exc:
            log.warning("could not change the marks of session pod %s (%s)", name, exc)

    async def _how_it_ended(self, name: str) -> tuple[int | None, bool]:
        """The exit code of a pod whose kernel died, and whether the memory limit killed it."""
        try:
            pod = await self._backend.follow_to_end(name, limit=_END_STATE_SECONDS)
        except (SandboxFailure, SandboxUnavailable, ApiError, aiohttp.ClientError, OSError) as exc:
            log.info("how session pod %s ended is unknown: %s", name, exc)
            return None, False
        terminated = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {}).get(
            "terminated") or {}
        code = terminated.get("exitCode")
        return code, terminated.get("reason") == "OOMKilled" or code == _OOM_EXIT_CODE

    def _stop(self, session: _PodSession) -> None:
        if session.stopped:
            return
        session.stopped = True
        session.reading.cancel()
        self._backend.delete_soon(session.name)

    async def _clean(self, session: _PodSession) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await session.reading
        for task in (session.marking, session.unmarking):  # the pod is being deleted: no mark to change
            if task is not None:
                task.cancel()
                await asyncio.wait({task})

    async def _tend(self) -> None:
        now = time.monotonic()
        for session in list(self._live.values()):
            if not session.busy and not session.gone() and now - session.written >= _KEEPALIVE_SECONDS:
                with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                    await self._write(session, b"\n")

    def _spawn(self, work: Any, *, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


async def _digests(files: tuple[InputFile, ...]) -> dict[str, str]:
    """Each file's name and content digest: a later call sends only the files its session's /input lacks. Off the
    event loop (a call may name 64 MiB: about 0.1 s of hashing that other agents' calls would wait for)."""
    if not files:
        return {}
    return await asyncio.to_thread(lambda: {file.name: hashlib.sha256(file.content).hexdigest() for file in files})


def _running(pod: K8sObject) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any((status.get("state") or {}).get("running") for status in statuses)


def _life_left(pod: K8sObject) -> float:
    """Seconds the pod may still run a session: to its deadline (the annotation every script pod carries), less the
    slack its last call needs."""
    stamp = (pod["metadata"].get("annotations") or {}).get(DEADLINE_ANNOTATION)
    try:
        left = (datetime.fromisoformat(stamp.replace("Z", "+00:00")) - now_utc()).total_seconds()
    except (AttributeError, TypeError, ValueError):
        return math.inf
    return left - DEADLINE_SLACK_SECONDS


def _failure(task: asyncio.Task[None]) -> str:
    if not task.done() or task.cancelled():
        return ""
    return repr(task.exception()) if task.exception() is not None else "the attach session ended"
