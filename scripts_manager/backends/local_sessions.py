"""A conversation's sandbox kept between calls (`scriptSessions: PerConversation`), in the local backend.

A session is one long-lived sandbox, the same bubblewrap (or weaker isolation) and rlimits a single script
gets, running `kernel.py`: a persistent interpreter that runs each call's script in one `__main__`, so
variables, imports and the files in its `/tmp` stay for the conversation's next call. Each call sees its own files under
`/input` (the folder the sandbox bound at its start, refilled before the call) and gets back what it wrote
under `/output` in that call (the folder is emptied before the next).

When and why a session ends is sessions.py's (shared by every backend). The session's
interpreter has RLIMIT_CPU of its `maxSeconds`; each call's timeout is held by the manager's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import TYPE_CHECKING

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.backends import SandboxUnavailable, ScriptJob, SessionTerms, outputs
from rockbot.scripts_manager.backends.cgroups import MemoryCgroups
from rockbot.scripts_manager.backends.job_dirs import FILES, HOOK, OUTPUT, SCRIPT
from rockbot.scripts_manager.backends.local import OOM_EXIT_CODE, _exit_code, _read_available
from rockbot.scripts_manager.backends.sessions import (
    KERNEL,
    TRAILER_BYTES,
    KernelStream,
    Session,
    Sessions,
    call_line,
    kernel_answer,
)
from rockbot.scripts_manager.settings import ScriptsManagerSettings

if TYPE_CHECKING:
    from rockbot.scripts_manager.backends.local import LocalBackend, Prepared

_READ_CHUNK = 64 * 1024
_AFTER_KILL_SECONDS = 2.0
_DIRECTORY = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY | os.O_NOFOLLOW


class _Session(Session):
    def __init__(
        self, *, terms: SessionTerms, shape: tuple[object, ...], process: asyncio.subprocess.Process,
        prepared: Prepared, calls: int, status: int, output: int, out: KernelStream, err: KernelStream,
        pumps: list[asyncio.Task[None]],
    ) -> None:  # fmt: skip
        super().__init__(terms=terms, shape=shape)
        self.process = process
        self.prepared = prepared
        self.calls = calls  # the kernel's stdin, one call per line
        self.status = status  # bubblewrap's --json-status-fd (read end)
        self.output = output  # its /output folder, as the manager opened it
        self.out, self.err = out, err
        self.pumps = pumps
        self.exited = asyncio.ensure_future(process.wait())

    def gone(self) -> bool:
        return self.exited.done()


class LocalSessions(Sessions[_Session]):
    """The local backend's sessions: one bubblewrap sandbox per (sender, conversation), kept between calls."""

    def __init__(self, *, backend: LocalBackend, settings: ScriptsManagerSettings) -> None:
        super().__init__(settings=settings)
        self._backend = backend

    async def _open(self, job: ScriptJob, *, shape: tuple[object, ...]) -> tuple[_Session, bool]:
        terms = job.session
        assert terms is not None
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
        out, err = KernelStream(), KernelStream()
        pumps = [asyncio.create_task(_pump(out_read, out)), asyncio.create_task(_pump(err_read, err))]
        session = _Session(terms=terms, shape=shape, process=process, prepared=prepared, calls=calls_write,
                           status=status_read, output=output, out=out, err=err, pumps=pumps)  # fmt: skip
        return session, False  # a sandbox on this machine: no other manager holds one of this conversation

    def _stop(self, session: _Session) -> None:
        _kill(session)

    async def _clean(self, session: _Session) -> None:
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

    async def _call(self, session: _Session, job: ScriptJob) -> ScriptInvokeResponse:
        if session.answered:  # the first call's files are the sandbox's from its start
            await asyncio.to_thread(session.prepared.job_dir.replace_files,
                                    [(file.name, file.content) for file in job.files])  # fmt: skip
        cap = self._settings.scripts_max_output_bytes
        line, marker = call_line(job)
        session.out.begin(marker=marker, cap=cap, trailer=TRAILER_BYTES)
        session.err.begin(marker=marker, cap=cap)
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
        oom_kills = 0
        if session.prepared.cgroup is not None:
            oom_kills = await asyncio.to_thread(MemoryCgroups.oom_kills, session.prepared.cgroup)
        collected = await asyncio.to_thread(outputs.collect, session.output, bounds=job.output_bounds)
        return kernel_answer(
            job, out=session.out, err=session.err, exit_code=exit_code, timed_out=timed_out,
            oom_killed=(exit_code == OOM_EXIT_CODE and session.exited.done()) or oom_kills > 0,
            duration_seconds=round(duration, 4), backend=f"local/{self._backend.isolation.kind}",
            artifacts=collected.artifacts, artifacts_dropped=collected.dropped,
        )  # fmt: skip


async def _pump(fd: int, stream: KernelStream) -> None:
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

