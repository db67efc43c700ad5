"""The local sandbox: each script is a subprocess behind `isolation`, with rlimits and output caps.

Limits come from `prlimit` (util-linux) so no Python code runs between fork and exec: address
space = ROCKBOT_SCRIPTS_MEMORY, CPU seconds = the timeout plus one, processes, file size and open
files. The environment is replaced, not filtered: nothing of the manager's reaches the script.
On timeout the whole process group is killed (with bubblewrap the script's PID namespace dies
with it, so even children that called setsid go). Running out of memory shows up locally as a
`MemoryError` at the address-space limit, and is reported as `oom_killed`.
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
from rockbot.scripts_manager.backends.isolation import Interpreter, Isolation, detect
from rockbot.scripts_manager.packages import PackageCache
from rockbot.scripts_manager.settings import ScriptsManagerSettings, quantity_bytes

_READ_CHUNK = 64 * 1024
_AFTER_KILL_SECONDS = 2.0
_MAX_PROCESSES = 256
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
        self._memory_bytes = quantity_bytes(settings.scripts_memory)
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
        job_dir = Path(await asyncio.to_thread(_write_job, job.script, job.input_data))
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
            f"--as={self._memory_bytes}",
            f"--cpu={math.ceil(job.timeout_seconds) + 1}",
            f"--nproc={_MAX_PROCESSES}",
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
        if inner_packages is not None:
            env["PYTHONPATH"] = str(inner_packages)
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
            oom_killed=exit_code not in (None, 0) and _ended_by_memory_error(text_err),
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


def _write_job(script: str, input_data: str | None) -> str:
    job_dir = Path(tempfile.mkdtemp(prefix="rockbot-script-"))
    (job_dir / "script.py").write_text(script, encoding="utf-8")
    (job_dir / "input").write_text(input_data or "", encoding="utf-8")
    (job_dir / "tmp").mkdir()
    job_dir.chmod(0o755)
    return str(job_dir)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def _ended_by_memory_error(stderr: str) -> bool:
    lines = stderr.rstrip().splitlines()
    return bool(lines) and lines[-1].startswith("MemoryError")
