"""The local sandbox: each script is a subprocess behind `isolation`, with rlimits and output caps.

Limits come from `prlimit` (util-linux) so no Python code runs between fork and exec: address
space = ROCKBOT_SCRIPTS_MEMORY, CPU seconds = the timeout plus one, processes, file size and open
files. The environment is replaced, not filtered: nothing of the manager's reaches the script.
On timeout the whole process group is killed (with bubblewrap the script's PID namespace dies
with it, so even children that called setsid go).

Out of memory: at the address-space limit Python raises `MemoryError`. A `sitecustomize` hook
(read-only, first on the script's PYTHONPATH) turns an *uncaught* one into death by SIGKILL, exit
137, as the kernel's OOM killer does in a pod, and only that outcome is reported as `oom_killed`:
text on stderr decides nothing. A script that exits 137 or SIGKILLs itself on purpose is reported
as out of memory too.

What remains: the memory limit is per process, not per script. The process limit (RLIMIT_NPROC)
counts every process of the user scripts run as (`nobody` when the manager is root), so it is a
budget shared by all running scripts: 8 per concurrency slot, which bounds local scripts together
to about 8 x concurrency x ROCKBOT_SCRIPTS_MEMORY. Only the pod backend has a real per-script
memory limit (the container's cgroup). A manager that is not root should run under a user of its
own, since its other processes count against the same budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.backends import SandboxFailure, ScriptJob
from rockbot.scripts_manager.backends.isolation import Interpreter, Isolation, detect, make_work_dir
from rockbot.scripts_manager.packages import PackageCache
from rockbot.scripts_manager.settings import ScriptsManagerSettings, quantity_bytes

_READ_CHUNK = 64 * 1024
_AFTER_KILL_SECONDS = 2.0
#: Processes per concurrency slot (the shared RLIMIT_NPROC budget; the sandbox itself takes 2 or 3).
_PROCESSES_PER_SLOT = 8
#: How a script ends when it dies of an uncaught MemoryError (128 + SIGKILL, like an OOM-killed container).
OOM_EXIT_CODE = 137
#: Installed as the script's `sitecustomize`: an uncaught MemoryError ends the process like the OOM killer would.
_MEMORY_HOOK = """\
import os, signal, sys

def _oom_on_memory_error(kind, value, traceback, _default=sys.excepthook):
    _default(kind, value, traceback)
    if issubclass(kind, MemoryError):
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)  # PID 1 of a namespace ignores its own SIGKILL

sys.excepthook = _oom_on_memory_error
"""
_MAX_OPEN_FILES = 256


class LocalBackend:
    name = "local"

    def __init__(
        self,
        *,
        isolation: Isolation,
        interpreter: Interpreter,
        settings: ScriptsManagerSettings,
        packages: PackageCache | None,
    ) -> None:
        self.isolation = isolation
        self._interpreter = interpreter
        self._settings = settings
        self._packages = packages
        self._tmp_bytes = quantity_bytes(settings.scripts_tmp_size)
        self._prlimit = shutil.which("prlimit")
        if self._prlimit is None:
            raise SandboxFailure("prlimit (util-linux) is needed to limit local scripts and is not installed")

    @classmethod
    async def create(cls, *, settings: ScriptsManagerSettings, search_path: str | None = None) -> LocalBackend:
        """Find the interpreter and an isolation that works; `SandboxUnavailable` names the fix if none does."""
        interpreter = await _interpreter(settings.scripts_local_python)
        isolation = await detect(
            mode=settings.scripts_local_isolation, interpreter=interpreter, search_path=search_path
        )
        packages = None
        if settings.scripts_allowed_packages:
            packages = PackageCache(
                root=settings.scripts_package_cache,
                python=interpreter.executable,
                index_url=settings.scripts_pip_index_url,
                find_links=settings.scripts_pip_find_links,
            )
        return cls(isolation=isolation, interpreter=interpreter, settings=settings, packages=packages)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse:
        packages_dir = None
        if job.packages:
            if self._packages is None:
                raise SandboxFailure("packages were allowed by policy but no package cache is configured")
            packages_dir = await self._packages.ensure(job.packages)
        job_dir = Path(await asyncio.to_thread(
            _write_job, job.script, job.input_data, as_nobody=self.isolation.setpriv is not None
        ))
        try:
            return await self._execute(job=job, job_dir=job_dir, packages_dir=packages_dir)
        finally:
            await asyncio.to_thread(shutil.rmtree, job_dir, True)

    async def _execute(self, *, job: ScriptJob, job_dir: Path, packages_dir: Path | None) -> ScriptInvokeResponse:
        prefix, inner_job, inner_packages, cwd = self.isolation.command(
            interpreter=self._interpreter, job_dir=job_dir, packages_dir=packages_dir, tmp_bytes=self._tmp_bytes
        )
        limits = [
            str(self._prlimit),
            f"--as={quantity_bytes(job.memory or self._settings.scripts_memory)}",
            f"--cpu={math.ceil(job.timeout_seconds) + 1}",
            f"--nproc={_PROCESSES_PER_SLOT * self._settings.scripts_concurrency}",
            f"--fsize={self._tmp_bytes}",
            f"--nofile={_MAX_OPEN_FILES}",
            "--core=0",
            "--",
        ]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(cwd),
            "TMPDIR": str(cwd),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env["PYTHONPATH"] = ":".join(str(d) for d in (inner_job / "hook", inner_packages) if d is not None)
        cap = self._settings.scripts_max_output_bytes
        stdout, stderr = _Capture(cap), _Capture(cap)
        started = time.monotonic()
        # Our own pipes (not asyncio's): waiting for the exit must not wait for every holder of the
        # pipes to go, and we close them ourselves if something outlives the script.
        process = await _spawn(
            [*limits, *prefix, self._interpreter.executable, "-s", str(inner_job / "script.py")],
            cwd=job_dir / "tmp", env=env, stdin_path=job_dir / "input", stdout=stdout, stderr=stderr,
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
        text_err = stderr.text()
        exit_code = None if timed_out else _exit_code(process.returncode)
        return ScriptInvokeResponse(
            request_id=job.request_id,
            stdout=stdout.text(),
            stderr=text_err,
            exit_code=exit_code,
            timed_out=timed_out,
            oom_killed=exit_code == OOM_EXIT_CODE,
            output_truncated=stdout.truncated or stderr.truncated,
            duration_seconds=round(duration, 4),
        )


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
    argv: list[str], *, cwd: Path, env: dict[str, str], stdin_path: Path, stdout: _Capture, stderr: _Capture
) -> asyncio.subprocess.Process:
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    stdin = await asyncio.to_thread(stdin_path.open, "rb")
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, start_new_session=True, stdin=stdin, stdout=out_write, stderr=err_write
        )
    except BaseException:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        stdin.close()
        os.close(out_write)
        os.close(err_write)
    await stdout.attach(out_read)
    await stderr.attach(err_read)
    return process


async def _interpreter(configured: str | None) -> Interpreter:
    executable = configured or _base_python()
    process = await asyncio.create_subprocess_exec(
        executable, "-I", "-c", "import os, sys; print(os.path.realpath(sys.prefix), os.path.realpath(sys.executable))",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise SandboxFailure(f"ROCKBOT_SCRIPTS_LOCAL_PYTHON={executable!r} does not run: {err.decode()[-300:]}")
    prefix, real = out.decode().split()
    return Interpreter(executable=real, prefix=prefix)


def _base_python() -> str:
    """This process's interpreter without its virtualenv, so scripts don't see the manager's packages."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = Path(sys.base_prefix) / "bin" / version
    return str(candidate) if candidate.exists() else sys.executable


def _write_job(script: str, input_data: str | None, *, as_nobody: bool) -> str:
    job_dir = Path(tempfile.mkdtemp(prefix="rockbot-script-"))
    (job_dir / "script.py").write_text(script, encoding="utf-8")
    (job_dir / "input").write_text(input_data or "", encoding="utf-8")
    (job_dir / "hook").mkdir()
    (job_dir / "hook" / "sitecustomize.py").write_text(_MEMORY_HOOK, encoding="utf-8")
    make_work_dir(job_dir / "tmp", as_nobody=as_nobody)
    job_dir.chmod(0o755)
    return str(job_dir)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode
