"""A conversation's sandbox kept between calls (`scriptSessions: PerConversation`), in the local backend.

A session is one long-lived sandbox, the same bubblewrap (or weaker isolation) and rlimits a single script
gets, running `kernel.py`: a persistent interpreter that runs each call's script in one `__main__`, so
variables, imports and the files in its `/tmp` stay for the conversation's next call. It is keyed by the
sender's broker-validated user and the request's conversation digest, so two agents, or two callers of one
agent, never share one; a conversation's calls run one after another. Each call sees its own files under
`/input` (the folder the sandbox bound at its start, refilled before the call) and gets back what it wrote
under `/output` in that call (the folder is emptied before the next).

A session ends, and its processes, files and memory go with it:
- when it has been idle for the Agent's `idleSeconds`, or alive for its `maxSeconds` (the sweep, every second);
- when a call's script crashes the interpreter, runs out of memory or out of time (that call says `ended`);
- when the Agent's limits or sessions settings change, or a call asks for other packages (a new sandbox);
- when the manager's caps are reached (ROCKBOT_SCRIPTS_SESSIONS_PER_AGENT: the agent's least recently used idle
  session ends), and when the manager stops.
The next call of that conversation then says `restarted`: never silently a fresh interpreter. The session's
interpreter has RLIMIT_CPU of its `maxSeconds`; each call's timeout is held by the manager's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.backends import SandboxUnavailable, ScriptJob, SessionTerms, outputs
from rockbot.scripts_manager.backends.cgroups import MemoryCgroups
from rockbot.scripts_manager.backends.job_dirs import FILES, HOOK, OUTPUT, SCRIPT
from rockbot.scripts_manager.backends.local import OOM_EXIT_CODE, _exit_code, _read_available
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.tasks import cancel_and_wait

if TYPE_CHECKING:
    from rockbot.scripts_manager.backends.local import LocalBackend, Prepared

log = logging.getLogger(__name__)

KERNEL = (Path(__file__).parent / "kernel.py").read_text()
_READ_CHUNK = 64 * 1024
_AFTER_KILL_SECONDS = 2.0
_SWEEP_SECONDS = 1.0
_DIRECTORY = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY | os.O_NOFOLLOW
#: Conversations whose session ended, remembered so their next call says `restarted`.
_REMEMBERED_ENDS = 4096


class _Stream:
    """One of a session's output streams: a call's output is what comes before that call's marker."""

    def __init__(self) -> None:
        self._marker = b""
        self._cap = 0
        self._kept = bytearray()
        self._pending = bytearray()  # bytes that may be the start of the marker
        self._trailer: bytearray | None = None
        self._wants_trailer = False
        self.truncated = False
        self.ended = asyncio.Event()
        self.closed = asyncio.Event()

    def begin(self, *, marker: bytes, cap: int, trailer: bool) -> None:
        self._marker, self._cap, self._wants_trailer = marker, cap, trailer
        self._kept, self._pending, self._trailer = bytearray(), bytearray(), None
        self.truncated = False
        self.ended = asyncio.Event()

    def feed(self, chunk: bytes) -> None:
        if not self._marker or self.ended.is_set():
            return  # between calls: something a script left running writes to nobody
        if self._trailer is not None:
            self._trailer += chunk
            if b"\n" in self._trailer:
                self.ended.set()
            return
        self._pending += chunk
        found = self._pending.find(self._marker)
        if found < 0:
            keep = len(self._pending) - len(self._marker) + 1
            if keep > 0:
                self._keep(self._pending[:keep])
                del self._pending[:keep]
            return
        self._keep(self._pending[:found])
        rest = bytes(self._pending[found + len(self._marker):])
        self._pending.clear()
        if self._wants_trailer:
            self._trailer = bytearray()
            self.feed(rest)
        else:
            self.ended.set()

    def _keep(self, data: bytes | bytearray) -> None:
        room = self._cap - len(self._kept)
        self._kept += data[: max(room, 0)]
        self.truncated = self.truncated or len(data) > room

    def text(self) -> str:
        if not self.ended.is_set():  # the session died mid-call: what it wrote, marker or not
            self._keep(self._pending)
            self._pending.clear()
        return self._kept.decode(errors="replace")

    def exit_code(self) -> int | None:
        """The call's exit code from the kernel's trailer; None if that is unreadable (the script wrote over it)."""
        try:
            code = json.loads(bytes(self._trailer or b"").partition(b"\n")[0])["exit_code"]
        except (ValueError, KeyError, TypeError):
            return None
        return code if isinstance(code, int) else None


class _Session:
    def __init__(
        self, *, terms: SessionTerms, shape: tuple[object, ...], process: asyncio.subprocess.Process,
        prepared: Prepared, calls: int, status: int, output: int, out: _Stream, err: _Stream,
        pumps: list[asyncio.Task[None]],
    ) -> None:  # fmt: skip
        self.terms = terms
        self.shape = shape
        self.process = process
        self.prepared = prepared
        self.calls = calls  # the kernel's stdin, one call per line
        self.status = status  # bubblewrap's --json-status-fd (read end)
        self.output = output  # its /output folder, as the manager opened it
        self.out, self.err = out, err
        self.pumps = pumps
        self.exited = asyncio.ensure_future(process.wait())
        self.started = self.used = time.monotonic()
        self.answered = 0
        self.busy = False

    def due(self, now: float) -> bool:
        """Whether it has been idle or alive too long (the Agent's idleSeconds, maxSeconds)."""
        return (now - self.used >= self.terms.idle_seconds) or (now - self.started >= self.terms.max_seconds)


class LocalSessions:
    """The local backend's sessions: one sandbox per (sender, conversation), kept between calls."""

    def __init__(self, *, backend: LocalBackend, settings: ScriptsManagerSettings) -> None:
        self._backend = backend
        self._settings = settings
        self._live: dict[str, _Session] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._sweeping: asyncio.Task[None] | None = None
        self._cleaning: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Sessions alive now."""
        return len(self._live)

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse:
        """Run `job` in its conversation's session (made, or made again, as needed)."""
        terms = job.session
        assert terms is not None
        lock = self._locks.setdefault(terms.key, asyncio.Lock())
        async with lock:
            shape = (job.packages, job.cpu, job.memory, terms.idle_seconds, terms.max_seconds)
            session = self._live.get(terms.key)
            if session is not None and (session.shape != shape or session.exited.done()
                                        or session.due(time.monotonic())):
                await self._end(session, why="its Agent's limits changed" if session.shape != shape else "it ended")
                session = None
            if session is None:
                said = "restarted" if terms.key in self._ended else "new"
                self._ended.pop(terms.key, None)
                session = await self._open(job, shape=shape)
            else:
                said = "kept"
            session.busy = True
            try:
                reply = await self._call(session, job)
            finally:
                session.busy = False
                session.used = time.monotonic()
            if session.exited.done():
                await self._end(session, why="its script ended it")
                said = "ended"
            return reply.model_copy(update={"session": said})

    async def close(self) -> None:
        await cancel_and_wait(self._sweeping)
        for session in list(self._live.values()):
            await self._end(session, why="the scripts-manager stops")
        await asyncio.gather(*self._cleaning, return_exceptions=True)

    async def _open(self, job: ScriptJob, *, shape: tuple[object, ...]) -> _Session:
        terms = job.session
        assert terms is not None
        self._make_room(terms)
        backend = self._backend
        prepared = await backend.prepare(job, script=KERNEL)
        bwrap = backend.isolation.kind == "bwrap"
        opened: list[int] = []
        try:
            job_fds = {}
            for name in (SCRIPT, HOOK) if bwrap else ():
                job_fds[name] = os.open(prepared.job_dir.path / name, os.O_RDONLY | os.O_CLOEXEC)
                opened.append(job_fds[name])
            status_read, status_write = os.pipe()
            opened.append(status_write)
            folders = []
            for name in (FILES, OUTPUT):
                folders.append(os.open(prepared.job_dir.path / name, _DIRECTORY))
                opened.append(folders[-1])
            input_fd, output_fd = folders
            calls_read, calls_write = os.pipe()
            out_read, out_write = os.pipe()
            err_read, err_write = os.pipe()
            opened += [calls_read, out_write, err_write]
            sandboxed, argv, env = backend.command(
                job_dir=prepared.job_dir.path, job_fds=job_fds, packages_dir=prepared.packages_dir,
                memory=prepared.memory, cpu_seconds=terms.max_seconds + 1, status_fd=status_write,
                cgroup=prepared.cgroup, input_fd=input_fd, output_fd=output_fd,
            )  # fmt: skip
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv, cwd=sandboxed.cwd, env=env, start_new_session=True, stdin=calls_read, stdout=out_write,
                    stderr=err_write, pass_fds=sandboxed.pass_fds,
                )  # fmt: skip
            except OSError as exc:
                for fd in (status_read, calls_write, out_read, err_read):
                    os.close(fd)
                raise SandboxUnavailable(f"the sandbox did not start: {exc}") from exc
        except BaseException:
            for fd in opened:
                os.close(fd)
            await backend.release(prepared)
            raise
        output = os.dup(output_fd)  # the session's /output, read after each call
        for fd in opened:
            os.close(fd)
        out, err = _Stream(), _Stream()
        pumps = [asyncio.create_task(_pump(out_read, out)), asyncio.create_task(_pump(err_read, err))]
        session = _Session(terms=terms, shape=shape, process=process, prepared=prepared, calls=calls_write,
                           status=status_read, output=output, out=out, err=err, pumps=pumps)  # fmt: skip
        self._live[terms.key] = session
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.create_task(self._sweep(), name="end idle script sessions")
        return session

    def _make_room(self, terms: SessionTerms) -> None:
        """Refuse, or end the agent's least recently used idle session, so the new one stays within the caps."""
        own = [session for session in self._live.values() if session.terms.owner == terms.owner]
        if len(own) >= self._settings.scripts_sessions_per_agent:
            idle = [session for session in own if not session.busy]
            if not idle:
                raise SandboxUnavailable(
                    f"this agent has {len(own)} script sessions busy, its most at this scripts-manager "
                    "(ROCKBOT_SCRIPTS_SESSIONS_PER_AGENT): try again when one of its calls has ended"
                )
            oldest = min(idle, key=lambda session: session.used)
            self._forget(oldest, why="its agent opened more sessions than ROCKBOT_SCRIPTS_SESSIONS_PER_AGENT")
        if len(self._live) >= self._settings.scripts_sessions:
            raise SandboxUnavailable(
                f"the scripts-manager keeps {len(self._live)} script sessions, its most (ROCKBOT_SCRIPTS_SESSIONS): "
                "try again when one has ended (idle sessions end after their Agent's scriptSessions.idleSeconds)"
            )

    def _forget(self, session: _Session, *, why: str) -> None:
        """End a session that no call uses, without waiting for it (the sweep and the caps)."""
        self._live.pop(session.terms.key, None)
        self._remember_end(session.terms.key)
        _kill(session)
        cleaning = asyncio.create_task(self._clean(session, why=why), name="remove an ended script session")
        self._cleaning.add(cleaning)
        cleaning.add_done_callback(self._cleaning.discard)

    async def _end(self, session: _Session, *, why: str) -> None:
        if self._live.get(session.terms.key) is session:
            del self._live[session.terms.key]
            self._remember_end(session.terms.key)
        _kill(session)
        await self._clean(session, why=why)

    def _remember_end(self, key: str) -> None:
        self._ended[key] = None
        while len(self._ended) > _REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    async def _clean(self, session: _Session, *, why: str) -> None:
        await session.exited
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_AFTER_KILL_SECONDS):
                await asyncio.gather(session.out.closed.wait(), session.err.closed.wait())
        for task in session.pumps:
            task.cancel()
        for fd in (session.calls, session.status, session.output):
            with contextlib.suppress(OSError):
                os.close(fd)
        await self._backend.release(session.prepared)
        log.info("script session of %s ended after %d calls: %s", session.terms.owner, session.answered, why)

    async def _sweep(self) -> None:
        while self._live:
            await asyncio.sleep(_SWEEP_SECONDS)
            now = time.monotonic()
            for session in list(self._live.values()):
                if not session.busy and session.due(now):
                    self._forget(session, why="idle or old (its Agent's scriptSessions)")

    async def _call(self, session: _Session, job: ScriptJob) -> ScriptInvokeResponse:
        if session.answered:  # the first call's files are the sandbox's from its start
            await asyncio.to_thread(session.prepared.job_dir.replace_files,
                                    [(file.name, file.content) for file in job.files])  # fmt: skip
        cap = self._settings.scripts_max_output_bytes
        marker = f"\0rockbot-end-{secrets.token_hex(16)}\0"
        session.out.begin(marker=marker.encode(), cap=cap, trailer=True)
        session.err.begin(marker=marker.encode(), cap=cap, trailer=False)
        line = json.dumps({"script": job.script, "input": job.input_data, "marker": marker}).encode() + b"\n"
        started = time.monotonic()
        writing = asyncio.ensure_future(asyncio.to_thread(_write_all, session.calls, line))
        answered = asyncio.ensure_future(asyncio.gather(session.out.ended.wait(), session.err.ended.wait()))
        done, _ = await asyncio.wait({answered, session.exited}, timeout=job.timeout_seconds,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        duration = time.monotonic() - started
        timed_out = not done
        if answered in done:
            exit_code = session.out.exit_code()
        else:
            answered.cancel()
            answered.add_done_callback(lambda gathered: gathered.cancelled() or gathered.exception())
            _kill(session)
            await session.exited
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_AFTER_KILL_SECONDS):
                    await asyncio.gather(session.out.closed.wait(), session.err.closed.wait())
            exit_code = None if timed_out else _exit_code(session.process.returncode)
            if not timed_out and session.answered == 0 and b'"child-pid"' not in _read_available(session.status) \
                    and self._backend.isolation.kind == "bwrap":
                raise SandboxUnavailable(f"the sandbox did not start: {session.err.text().strip()[-300:]}")
        with contextlib.suppress(OSError):
            await writing
        session.answered += 1
        oom_kills = 0
        if session.prepared.cgroup is not None:
            oom_kills = await asyncio.to_thread(MemoryCgroups.oom_kills, session.prepared.cgroup)
        collected = await asyncio.to_thread(outputs.collect, session.output, bounds=job.output_bounds)
        return ScriptInvokeResponse(
            request_id=job.request_id,
            stdout=session.out.text(),
            stderr=session.err.text(),
            exit_code=exit_code,
            timed_out=timed_out,
            oom_killed=(exit_code == OOM_EXIT_CODE and session.exited.done()) or oom_kills > 0,
            output_truncated=session.out.truncated or session.err.truncated,
            duration_seconds=round(duration, 4),
            backend=f"local/{self._backend.isolation.kind}",
            artifacts=collected.artifacts,
            artifacts_dropped=collected.dropped,
        )


async def _pump(fd: int, stream: _Stream) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_CHUNK)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))  # fmt: skip
    try:
        while chunk := await reader.read(_READ_CHUNK):
            stream.feed(chunk)
    finally:
        transport.close()
        stream.closed.set()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _kill(session: _Session) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session.process.pid, 9)

