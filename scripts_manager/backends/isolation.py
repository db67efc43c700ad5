"""How a local script is cut off from the host: bubblewrap, or (only if asked) something weaker.

bubblewrap gives the script new user, network, PID, IPC and UTS namespaces, a read-only view of
just `/usr` and the interpreter's prefix, a private size-limited `/tmp`, and no capabilities; it
dies with the manager. It is the only sandbox `auto` will use.

`unshare --net --map-root-user --pid` cuts the network and the PIDs but is *not* a filesystem
sandbox: the script runs as uid 0 of its namespace (the manager's user outside), sees and can
write whatever that user can, and shares the host's /tmp. Giving it a mount namespace of its own
would rebuild bubblewrap by hand, so instead it is never picked silently: `auto` without a working
bubblewrap refuses, naming ROCKBOT_SCRIPTS_LOCAL_ISOLATION and the fix (install bubblewrap), and
`unshare` (like `unsafe-none`, which isolates nothing) must be chosen explicitly and is logged as a
warning every time a backend starts with it.

A manager running as root starts every sandbox as `nobody` (65534, via util-linux `setpriv`):
root ignores RLIMIT_NPROC, so without the drop the process limit would not hold, and a script that
escapes its namespaces still owns nothing on the host. If nobody cannot reach the interpreter
(say, a pyenv under /root), scripts stay root and a warning says how to fix it.
`unsafe-none` never drops.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rockbot.scripts_manager.backends import SandboxUnavailable

log = logging.getLogger(__name__)

IsolationKind = Literal["bwrap", "unshare", "unsafe-none"]

#: Who scripts run as when the manager is root.
NOBODY = 65534
#: Where the bubblewrap sandbox sees the job's files and the package set.
SANDBOX_JOB_DIR = Path("/sandbox")
SANDBOX_PACKAGES_DIR = Path("/opt/rockbot/packages")

_INSTALL_HINT = (
    "install bubblewrap (apt-get install -y bubblewrap); only for trusted scripts on a development machine, "
    "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unshare cuts the network but not the filesystem, and "
    "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unsafe-none runs them without any isolation"
)
_WEAK = {
    "unshare": "no network, but the script runs as uid 0 of its namespace and can read and write the host's files",
    "unsafe-none": "the script runs as a plain subprocess with the manager's rights and network",
}


class Interpreter(BaseModel):
    """The Python that runs scripts, and the directory tree it needs to see."""

    model_config = ConfigDict(frozen=True)

    executable: str
    prefix: str


class Isolation(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: IsolationKind
    executable: str | None = None
    #: `setpriv`, when the manager is root and drops to `nobody` before isolating.
    setpriv: str | None = None

    def command(
        self, *, interpreter: Interpreter, job_dir: Path, packages_dir: Path | None, tmp_bytes: int
    ) -> tuple[list[str], Path, Path | None, Path]:
        """The argv prefix, and where the script sees its job dir, packages and working dir."""
        argv, inner_job, inner_packages, cwd = self._isolate(
            interpreter=interpreter, job_dir=job_dir, packages_dir=packages_dir, tmp_bytes=tmp_bytes
        )
        if self.setpriv is not None:
            drop = [self.setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
            argv = [*drop, *argv]
        return argv, inner_job, inner_packages, cwd

    def _isolate(
        self, *, interpreter: Interpreter, job_dir: Path, packages_dir: Path | None, tmp_bytes: int
    ) -> tuple[list[str], Path, Path | None, Path]:
        if self.kind == "bwrap":
            argv = [
                str(self.executable), "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
                "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
                "--ro-bind-try", "/etc/localtime", "/etc/localtime",
                "--proc", "/proc", "--dev", "/dev",
                "--size", str(tmp_bytes), "--tmpfs", "/tmp",
                "--ro-bind", str(job_dir), str(SANDBOX_JOB_DIR),
                "--chdir", "/tmp",
            ]  # fmt: skip
            if not interpreter.prefix.startswith("/usr/"):
                argv += ["--ro-bind", interpreter.prefix, interpreter.prefix]
            inner_packages = None
            if packages_dir is not None:
                argv += ["--ro-bind", str(packages_dir), str(SANDBOX_PACKAGES_DIR)]
                inner_packages = SANDBOX_PACKAGES_DIR
            return [*argv, "--"], SANDBOX_JOB_DIR, inner_packages, Path("/tmp")
        work = job_dir / "tmp"
        if self.kind == "unshare":
            argv = [str(self.executable), "--net", "--map-root-user", "--pid", "--fork", "--kill-child", "--"]
            return argv, job_dir, packages_dir, work
        return [], job_dir, packages_dir, work


async def detect(
    *, mode: Literal["auto", "bwrap", "unshare", "unsafe-none"], interpreter: Interpreter,
    search_path: str | None = None,
) -> Isolation:
    """The isolation asked for (`auto` means bubblewrap), once it starts a Python here; refuse clearly otherwise."""
    if mode == "unsafe-none":
        isolation = Isolation(kind="unsafe-none")
    else:
        kind: IsolationKind = "bwrap" if mode == "auto" else mode
        executable = shutil.which(kind, path=search_path)
        if executable is None:
            raise SandboxUnavailable(_refusal(mode=mode, problem=f"{kind}: not installed"))
        isolation = await _as_nobody_if_root(Isolation(kind=kind, executable=executable), interpreter=interpreter)
        problem = await _probe(isolation=isolation, interpreter=interpreter)
        if problem is not None:
            raise SandboxUnavailable(_refusal(mode=mode, problem=f"{kind}: {problem}"))
    if isolation.kind in _WEAK:
        log.warning(
            "UNSAFE: ROCKBOT_SCRIPTS_LOCAL_ISOLATION=%s is not a sandbox (%s); use it only for trusted scripts, "
            "and install bubblewrap for anything else", isolation.kind, _WEAK[isolation.kind],
        )  # fmt: skip
    return isolation


async def _as_nobody_if_root(isolation: Isolation, *, interpreter: Interpreter) -> Isolation:
    """Run as nobody when root, if nobody can reach the interpreter; otherwise say what is lost."""
    setpriv = shutil.which("setpriv") if os.geteuid() == 0 else None
    if setpriv is None:
        return isolation
    dropped = isolation.model_copy(update={"setpriv": setpriv})
    problem = await _probe(isolation=dropped, interpreter=interpreter)
    if problem is None:
        return dropped
    log.warning(
        "scripts run as root because user nobody cannot start %s (%s): the process limit is not enforced; set "
        "ROCKBOT_SCRIPTS_LOCAL_PYTHON to an interpreter the user nobody can run, such as /usr/bin/python3",
        interpreter.executable, problem,
    )  # fmt: skip
    return isolation


def _refusal(*, mode: str, problem: str) -> str:
    return f"ROCKBOT_SCRIPTS_LOCAL_ISOLATION={mode} cannot isolate local scripts here ({problem}): {_INSTALL_HINT}"


async def _probe(*, isolation: Isolation, interpreter: Interpreter) -> str | None:
    probe_dir = Path(await asyncio.to_thread(_make_probe_dir))
    try:
        prefix, _, _, cwd = isolation.command(
            interpreter=interpreter, job_dir=probe_dir, packages_dir=None, tmp_bytes=1 << 20
        )
        process = await asyncio.create_subprocess_exec(
            *prefix, interpreter.executable, "-c", "pass",
            cwd=cwd if isolation.kind != "bwrap" else probe_dir,
            env={"PATH": "/usr/bin:/bin"},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await process.communicate()
    finally:
        await asyncio.to_thread(shutil.rmtree, probe_dir, True)
    if process.returncode != 0:
        return stderr.decode(errors="replace").strip()[-300:] or f"exit code {process.returncode}"
    return None


def _make_probe_dir() -> str:
    path = Path(tempfile.mkdtemp(prefix="rockbot-probe-"))
    path.chmod(0o755)
    make_work_dir(path / "tmp", as_nobody=os.geteuid() == 0)
    return str(path)


def make_work_dir(path: Path, *, as_nobody: bool) -> None:
    """The script's writable working directory outside bubblewrap: owned by whoever the script runs as."""
    path.mkdir()
    if as_nobody:
        os.chown(path, NOBODY, NOBODY)
