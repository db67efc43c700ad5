"""The local sandbox: each script is a subprocess behind `isolation`, with rlimits and output caps.

Limits come from `prlimit` (util-linux), started inside the sandbox right before the interpreter,
so no Python code runs between fork and exec: address space = ROCKBOT_SCRIPTS_MEMORY, CPU seconds
= the timeout plus one, processes, file size and open files. In bubblewrap's user namespace the
kernel (Linux 5.14 or newer) counts RLIMIT_NPROC for that sandbox alone, so the budget of 8
processes (threads and the interpreter included) is each script's own: a fork
bomb stops at 8, and neither it nor anything else its user runs on the host takes a concurrent
script's processes. The environment is replaced, not filtered: nothing of the manager's reaches
the script. On timeout the whole process group is killed (with bubblewrap the script's PID
namespace dies with it, so even children that called setsid go). A sandbox that never started the
script (bubblewrap reports no exit code for it) is `SandboxUnavailable`, never the script's exit code.

The interpreter is ROCKBOT_SCRIPTS_LOCAL_PYTHON if set, else the first of this process's base
interpreter and /usr/bin/python3 that starts in the sandbox (as `nobody` under a root manager, so
a pyenv or venv under /root gives way to Debian's Python); if none does, the backend refuses.

Out of memory: at the address-space limit Python raises `MemoryError`. A `sitecustomize` hook
(read-only, first on the script's PYTHONPATH) turns an *uncaught* one into death by SIGKILL, exit
137, as the kernel's OOM killer does in a pod, and only that outcome is reported as `oom_killed`:
text on stderr decides nothing. A script that exits 137 or SIGKILLs itself on purpose is reported
as out of memory too.

Memory: where the manager may make memory cgroups (root on a cgroup v1 host, `cgroups.py`) each
run gets its own, so a script's processes and its /tmp and /dev/shm are held to
ROCKBOT_SCRIPTS_MEMORY together, and an OOM kill there is reported as `oom_killed`. Elsewhere (not
root, or cgroup v2) memory is limited per process only: a script may hold up to 8 x
ROCKBOT_SCRIPTS_MEMORY plus its tmpfs mounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable, ScriptJob, Taken, outputs
from rockbot.scripts_manager.backends import isolation as isolations
from rockbot.scripts_manager.backends.cgroups import MemoryCgroups
from rockbot.scripts_manager.backends.figures import FIGURES_BACKEND, FIGURES_HOOK
from rockbot.scripts_manager.backends.isolation import Interpreter, Isolation, Sandboxed
from rockbot.scripts_manager.backends.job_dirs import FILES, HOOK, INPUT, OUTPUT, SCRIPT, JobDir, reap
from rockbot.scripts_manager.packages import PackageCache, default_root
from rockbot.scripts_manager.settings import ScriptsManagerSettings, quantity_bytes
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

_READ_CHUNK = 64 * 1024
_AFTER_KILL_SECONDS = 2.0
#: Processes (and threads) of one script, the interpreter included.
_PROCESSES = 8
#: Readable by every user on Debian: the interpreter tried when this process's own does not start.
SYSTEM_PYTHON = "/usr/bin/python3"
_PROBE_SECONDS = 30.0
#: How a script ends when it dies of an uncaught MemoryError (128 + SIGKILL, like an OOM-killed container).
OOM_EXIT_CODE = 137
#: Installed as the script's `sitecustomize`: an uncaught MemoryError ends the process like the OOM killer would, and
#: (as the matplotlib backend MPLBACKEND names) `plt.show()` saves each open figure as a PNG under /output.
_MEMORY_HOOK = """\
import os, signal, sys

def _oom_on_memory_error(kind, value, traceback, _default=sys.excepthook):
    _default(kind, value, traceback)
    if issubclass(kind, MemoryError):
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)  # PID 1 of a namespace ignores its own SIGKILL

sys.excepthook = _oom_on_memory_error
""" + FIGURES_HOOK
_MAX_OPEN_FILES = 256
_UNSAFE_HINT = (
    "only for trusted scripts on a development machine, ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unsafe-none runs them "
    "without a sandbox"
)


class LocalBackend:
    name = "local"

    def __init__(
        self,
        *,
        isolation: Isolation,
        interpreter: Interpreter,
        settings: ScriptsManagerSettings,
        packages: PackageCache | None,
        cgroups: MemoryCgroups | None,
    ) -> None:
        self.isolation = isolation
        self._interpreter = interpreter
        self._settings = settings
        self._packages = packages
        self._cgroups = cgroups
        self._tmp_bytes = quantity_bytes(settings.scripts_tmp_size)
        from rockbot.scripts_manager.backends.local_sessions import LocalSessions  # it builds on this module

        self.sessions = LocalSessions(backend=self, settings=settings)
        self._prlimit = shutil.which("prlimit")
        if self._prlimit is None:
            raise SandboxFailure("prlimit (util-linux) is needed to limit local scripts and is not installed")

    @classmethod
    async def create(cls, *, settings: ScriptsManagerSettings, search_path: str | None = None) -> LocalBackend:
        """Find an isolation and an interpreter that starts in it; `SandboxUnavailable` names the fix if none does."""
        isolation = isolations.find(mode=settings.scripts_local_isolation, search_path=search_path)
        cgroups = await asyncio.to_thread(MemoryCgroups.find)
        if removed := await asyncio.to_thread(reap):
            log.info("removed %d job folders that a killed scripts-manager left behind", len(removed))
            for name in removed if cgroups is not None else ():
                await cgroups.remove(cgroups.base / name)
        interpreter = await _starting_interpreter(isolation=isolation, settings=settings, cgroups=cgroups)
        packages = None
        if settings.scripts_allowed_packages:
            packages = PackageCache(
                root=settings.scripts_package_cache or default_root(),
                python=interpreter.executable,
                index_url=settings.scripts_pip_index_url,
                find_links=settings.scripts_pip_find_links,
            )
            await asyncio.to_thread(packages.check, reader_uid=isolation.script_uid)
        return cls(isolation=isolation, interpreter=interpreter, settings=settings, packages=packages, cgroups=cgroups)

    orphans = None  # a local sandbox dies with its manager (bubblewrap's --die-with-parent)
    #: A subprocess starts in milliseconds; a first install of a `pip_packages` set takes the rest.
    start_seconds = 60.0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await self.sessions.close()

    async def taken_before(self, *, user: str, request_id: str) -> Taken | None:
        """None: a local sandbox dies with the process that ran it (bubblewrap's --die-with-parent), and its copy
        comes back to this process only if it lost the broker while the run went on (which the service joins)."""
        return None

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse:
        """Prepare the job (start-up), run it in its sandbox (run), remove what it left (cleanup): a span each.
        A session's call goes to its conversation's sandbox instead (`LocalSessions`)."""
        if job.session is not None:
            return await self.sessions.run(job)
        with tracer.start_as_current_span("start-up"):
            prepared = await self.prepare(job, script=job.script)
        try:
            with tracer.start_as_current_span("run"):
                return await self._execute(
                    job=job, job_dir=prepared.job_dir.path, packages_dir=prepared.packages_dir,
                    memory=prepared.memory, cgroup=prepared.cgroup,
                )  # fmt: skip
        finally:
            with tracer.start_as_current_span("cleanup"):
                await self.release(prepared)

    async def prepare(self, job: ScriptJob, *, script: str) -> Prepared:
        """The sandbox's files, packages and memory cgroup, for `script` (the job's, or a session's kernel)."""
        packages_dir = None
        if job.packages:
            if self._packages is None:
                raise SandboxFailure("packages were allowed by policy but no package cache is configured")
            packages_dir = await self._packages.ensure(job.packages)
        memory = quantity_bytes(job.memory or self._settings.scripts_memory)
        job_dir = await asyncio.to_thread(
            JobDir.write, script=script, input_data=job.input_data, hook=_MEMORY_HOOK,
            files=[(file.name, file.content) for file in job.files], script_uid=self.isolation.script_uid,
        )  # fmt: skip
        cgroup = await self._cgroup(job_dir, memory=memory)
        return Prepared(job_dir=job_dir, packages_dir=packages_dir, memory=memory, cgroup=cgroup)

    async def release(self, prepared: Prepared) -> None:
        if prepared.cgroup is not None and self._cgroups is not None:
            await self._cgroups.remove(prepared.cgroup)
        await asyncio.to_thread(prepared.job_dir.remove)

    async def _cgroup(self, job_dir: JobDir, *, memory: int) -> Path | None:
        """The job's memory cgroup, where the manager can make one; the job's folder goes if that fails."""
        if self._cgroups is None:
            return None
        try:
            return await asyncio.to_thread(self._cgroups.create, job_dir.path.name, limit_bytes=memory)
        except BaseException:
            await asyncio.to_thread(job_dir.remove)
            raise

    async def problem(self) -> str | None:
        """Why a script cannot run here, or None: a trivial one, run the way every script is."""
        try:
            probe = ScriptJob(request_id="probe", script="pass", input_data=None, timeout_seconds=_PROBE_SECONDS)
            with tracer.start_as_current_span("check sandbox"):  # one trace of its own, not three loose steps
                result = await self.run(probe)
        except (SandboxUnavailable, SandboxFailure) as exc:
            return str(exc)
        if result.exit_code != 0:
            return result.stderr.strip()[-300:] or f"exit code {result.exit_code}"
        return None

    def command(
        self, *, job_dir: Path, job_fds: dict[str, int], packages_dir: Path | None, memory: int, cpu_seconds: int,
        status_fd: int, cgroup: Path | None, input_fd: int, output_fd: int,
    ) -> tuple[Sandboxed, list[str], dict[str, str]]:
        """How to start the job folder's script in its sandbox under the rlimits: the sandbox, argv and environment
        (the manager's own environment never reaches a script)."""
        sandboxed = self.isolation.sandbox(
            interpreter=self._interpreter, job_dir=job_dir, job_fds=job_fds, packages_dir=packages_dir,
            tmp_bytes=self._tmp_bytes, status_fd=status_fd, input_fd=input_fd, output_fd=output_fd,
        )  # fmt: skip
        limits = [
            str(self._prlimit),
            f"--as={memory}",
            f"--cpu={cpu_seconds}",
            f"--nproc={_PROCESSES}",
            f"--fsize={self._tmp_bytes}",
            f"--nofile={_MAX_OPEN_FILES}",
            "--core=0",
            "--",
        ]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(sandboxed.work_dir),
            "TMPDIR": str(sandboxed.work_dir),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "ROCKBOT_INPUT_DIR": str(sandboxed.input_dir),
            "ROCKBOT_OUTPUT_DIR": str(sandboxed.output_dir),
            "MPLBACKEND": FIGURES_BACKEND,
            # One BLAS thread: a script has 8 processes and threads in all, and each of OpenBLAS's reserves
            # tens of MiB of address space, which alone took numpy and pandas past a 256Mi sandbox.
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        path = ((sandboxed.job_dir / HOOK).parent, sandboxed.packages_dir)
        env["PYTHONPATH"] = ":".join(str(folder) for folder in path if folder is not None)
        join = [] if cgroup is None else MemoryCgroups.join(cgroup)
        script = str(sandboxed.job_dir / SCRIPT)
        return sandboxed, [*join, *sandboxed.argv, *limits, self._interpreter.executable, "-s", script], env

    async def _execute(
        self, *, job: ScriptJob, job_dir: Path, packages_dir: Path | None, memory: int, cgroup: Path | None
    ) -> ScriptInvokeResponse:
        bwrap = self.isolation.kind == "bwrap"
        with contextlib.ExitStack() as descriptors:
            job_fds = {name: _opened(descriptors, job_dir / name) for name in (SCRIPT, HOOK)} if bwrap else {}
            status_read, status_write = os.pipe()
            descriptors.callback(os.close, status_read)
            descriptors.callback(os.close, status_write)
            input_fd, output_fd = (_opened(descriptors, job_dir / name, directory=True) for name in (FILES, OUTPUT))
            sandboxed, argv, env = self.command(
                job_dir=job_dir, job_fds=job_fds, packages_dir=packages_dir, memory=memory,
                cpu_seconds=math.ceil(job.timeout_seconds) + 1, status_fd=status_write, cgroup=cgroup,
                input_fd=input_fd, output_fd=output_fd,
            )  # fmt: skip
            cap = self._settings.scripts_max_output_bytes
            stdout, stderr = _Capture(cap), _Capture(cap)
            started = time.monotonic()
            # Our own pipes (not asyncio's): waiting for the exit must not wait for every holder of the
            # pipes to go, and we close them ourselves if something outlives the script.
            process = await _spawn(
                argv, cwd=sandboxed.cwd, env=env, stdin_path=job_dir / INPUT, stdout=stdout, stderr=stderr,
                pass_fds=sandboxed.pass_fds,
            )  # fmt: skip
            timed_out = False
            try:
                try:
                    async with asyncio.timeout(job.timeout_seconds):
                        await process.wait()
                except TimeoutError:
                    timed_out = True
            finally:
                _kill_group(process)
                await process.wait()
            duration = time.monotonic() - started
            await asyncio.wait([stdout.done, stderr.done], timeout=_AFTER_KILL_SECONDS)
            stdout.close()
            stderr.close()
            if bwrap and not timed_out and b'"exit-code"' not in _read_available(status_read):
                raise SandboxUnavailable(f"the sandbox did not start: {stderr.text().strip()[-300:]}")
            oom_kills = 0 if cgroup is None else await asyncio.to_thread(MemoryCgroups.oom_kills, cgroup)
            collected = await asyncio.to_thread(outputs.collect, output_fd, bounds=job.output_bounds)
        text_err = stderr.text()
        exit_code = None if timed_out else _exit_code(process.returncode)
        return ScriptInvokeResponse(
            request_id=job.request_id,
            stdout=stdout.text(),
            stderr=text_err,
            exit_code=exit_code,
            timed_out=timed_out,
            oom_killed=exit_code == OOM_EXIT_CODE or oom_kills > 0,
            output_truncated=stdout.truncated or stderr.truncated,
            duration_seconds=round(duration, 4),
            backend=f"local/{self.isolation.kind}",
            artifacts=collected.artifacts,
            artifacts_dropped=collected.dropped,
        )


class Prepared(NamedTuple):
    """A sandbox's files on the host, until `LocalBackend.release`."""

    job_dir: JobDir
    packages_dir: Path | None
    memory: int
    cgroup: Path | None


class _Capture:
    """One output stream: keeps the first `cap` bytes and drains (drops) the rest so the script never blocks."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._kept = bytearray()
        self.truncated = False
        self._transport: asyncio.ReadTransport | None = None
        self.done: asyncio.Task[None]

    async def attach(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_READ_CHUNK)
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        self.done = asyncio.create_task(self._drain(reader))

    async def _drain(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(_READ_CHUNK):
            room = self._cap - len(self._kept)
            if room > 0:
                self._kept += chunk[:room]
            self.truncated = self.truncated or len(chunk) > room

    def close(self) -> None:
        """Stop reading (something the script left behind may still hold the pipe open)."""
        self.done.cancel()
        if self._transport is not None:
            self._transport.close()

    def text(self) -> str:
        return self._kept.decode(errors="replace")


async def _spawn(
    argv: list[str], *, cwd: Path, env: dict[str, str], stdin_path: Path, stdout: _Capture, stderr: _Capture,
    pass_fds: tuple[int, ...],
) -> asyncio.subprocess.Process:
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    stdin = await asyncio.to_thread(stdin_path.open, "rb")
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, start_new_session=True, stdin=stdin, stdout=out_write, stderr=err_write,
            pass_fds=pass_fds,
        )  # fmt: skip
    except BaseException as exc:
        os.close(out_read)
        os.close(err_read)
        if isinstance(exc, OSError):
            raise SandboxUnavailable(f"the sandbox did not start: {exc}") from exc
        raise
    finally:
        stdin.close()
        os.close(out_write)
        os.close(err_write)
    await stdout.attach(out_read)
    await stderr.attach(err_read)
    return process


async def _starting_interpreter(
    *, isolation: Isolation, settings: ScriptsManagerSettings, cgroups: MemoryCgroups | None
) -> Interpreter:
    """ROCKBOT_SCRIPTS_LOCAL_PYTHON, else the first default that starts a script in `isolation`; never root's."""
    configured = settings.scripts_local_python
    candidates = [configured] if configured else [_base_python(), SYSTEM_PYTHON]
    problems: list[str] = []
    tried: set[Interpreter] = set()
    for candidate in candidates:
        try:
            interpreter = await _interpreter(candidate)
        except (OSError, SandboxFailure) as exc:
            problems.append(f"{candidate}: {exc}")
            continue
        if interpreter in tried:
            continue
        tried.add(interpreter)
        probe = LocalBackend(
            isolation=isolation, interpreter=interpreter, settings=settings, packages=None, cgroups=cgroups
        )
        problem = await probe.problem()
        if problem is None:
            if problems:
                log.info("scripts run with %s, since %s", candidate, "; ".join(problems))
            return interpreter
        problems.append(f"{candidate}: {problem}")
    where = f"the {isolation.kind} sandbox" + (" as user nobody" if isolation.setpriv else "")
    fix = f"a Python every user can read, such as {SYSTEM_PYTHON} (apt-get install -y python3)"
    if configured:
        raise SandboxUnavailable(
            f"ROCKBOT_SCRIPTS_LOCAL_PYTHON={configured} does not start in {where} ({problems[0]}): set it to {fix}, "
            f"or unset it; {_UNSAFE_HINT}"
        )
    raise SandboxUnavailable(
        f"ROCKBOT_SCRIPTS_LOCAL_ISOLATION={settings.scripts_local_isolation}: no Python starts in {where} "
        f"({'; '.join(problems)}): set ROCKBOT_SCRIPTS_LOCAL_PYTHON to {fix}; bubblewrap must be 0.8.0 or newer "
        f"(apt-get install -y bubblewrap); {_UNSAFE_HINT}"
    )


async def _interpreter(executable: str) -> Interpreter:
    process = await asyncio.create_subprocess_exec(
        executable, "-I", "-c", "import os, sys; print(os.path.realpath(sys.prefix), os.path.realpath(sys.executable))",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise SandboxFailure(f"does not run: {err.decode(errors='replace')[-300:]}")
    prefix, real = out.decode().split()
    return Interpreter(executable=real, prefix=prefix)


def _base_python() -> str:
    """This process's interpreter without its virtualenv, so scripts don't see the manager's packages."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = Path(sys.base_prefix) / "bin" / version
    return str(candidate) if candidate.exists() else sys.executable


def _opened(descriptors: contextlib.ExitStack, path: Path, *, directory: bool = False) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY | os.O_NOFOLLOW if directory else 0))
    descriptors.callback(os.close, fd)
    return fd


def _read_available(fd: int) -> bytes:
    """What has been written to a pipe so far (its writers are done, but we hold a write end too)."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    return b"".join(chunks)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode
