"""How a local script is cut off from the host: bubblewrap, else `unshare`, else (only if asked) nothing.

bubblewrap gives the script new user, network, PID, IPC and UTS namespaces, a read-only view of
just `/usr` and the interpreter's prefix, a private size-limited `/tmp`, and no capabilities; it
dies with the manager. `unshare --net --map-root-user --pid` is the fallback where bubblewrap is
missing: no network and its own PIDs, but the host filesystem stays visible (as the manager's
user), so prefer bubblewrap. `unsafe-none` runs the script as a plain subprocess and exists only
for machines where neither works and the user opted in explicitly.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rockbot.scripts_manager.backends import SandboxUnavailable

IsolationKind = Literal["bwrap", "unshare", "unsafe-none"]

#: Where the bubblewrap sandbox sees the job's files and the package set.
SANDBOX_JOB_DIR = Path("/sandbox")
SANDBOX_PACKAGES_DIR = Path("/opt/rockbot/packages")

_UNSAFE_HINT = (
    "install bubblewrap (apt-get install -y bubblewrap) or allow user namespaces for `unshare`; "
    "only for trusted scripts on a development machine, ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unsafe-none "
    "runs them without any isolation"
)


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
    """The first isolation that actually starts a Python here; refuse clearly when none does."""
    if mode == "unsafe-none":
        return Isolation(kind="unsafe-none")
    kinds: list[IsolationKind] = ["bwrap", "unshare"] if mode == "auto" else [mode]
    problems: list[str] = []
    for kind in kinds:
        executable = shutil.which(kind, path=search_path)
        if executable is None:
            problems.append(f"{kind}: not installed")
            continue
        isolation = Isolation(kind=kind, executable=executable)
        problem = await _probe(isolation=isolation, interpreter=interpreter)
        if problem is None:
            return isolation
        problems.append(f"{kind}: {problem}")
    raise SandboxUnavailable(
        f"no way to isolate local scripts works here ({'; '.join(problems)}): {_UNSAFE_HINT}"
    )


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
