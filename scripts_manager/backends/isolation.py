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
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rockbot.scripts_manager.backends import SandboxUnavailable

log = logging.getLogger(__name__)

IsolationKind = Literal["bwrap", "unshare", "unsafe-none"]

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

    def command(
        self, *, interpreter: Interpreter, job_dir: Path, packages_dir: Path | None, tmp_bytes: int
    ) -> tuple[list[str], Path, Path | None, Path]:
        """The argv prefix, and where the script sees its job dir, packages and working dir."""
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
        isolation = Isolation(kind=kind, executable=executable)
        problem = await _probe(isolation=isolation, interpreter=interpreter)
        if problem is not None:
            raise SandboxUnavailable(_refusal(mode=mode, problem=f"{kind}: {problem}"))
    if isolation.kind in _WEAK:
        log.warning(
            "UNSAFE: ROCKBOT_SCRIPTS_LOCAL_ISOLATION=%s is not a sandbox (%s); use it only for trusted scripts, "
            "and install bubblewrap for anything else", isolation.kind, _WEAK[isolation.kind],
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
    (path / "tmp").mkdir()
    return str(path)
