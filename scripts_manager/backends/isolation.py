"""How a local script is cut off from the host: bubblewrap, or (only if asked) something weaker.

bubblewrap (0.8.0 or newer) gives the script new user, network, PID, IPC, UTS and cgroup namespaces,
no capabilities, and no further user namespaces (`--disable-userns`), so it cannot mount anything.
The script is its sandbox's PID 1 (`--as-pid-1`): no process of bubblewrap's runs in there beside it
(its init would run as the same user, where the script could trace it and act as it). All it can
write are a private `/tmp` and `/dev/shm`, tmpfs mounts of ROCKBOT_SCRIPTS_TMP_SIZE each; everything
else is read-only: `/`, `/etc` and `/dev` themselves, `/usr`, the interpreter's prefix, the package
set, and the job's script and hook, which bubblewrap copies in from descriptors the manager opened
(the job folder stays private to the manager). The sandbox dies with the manager. It is the only
isolation `auto` uses.

A manager running as root starts every sandbox as `nobody` (65534, via util-linux `setpriv`): root
ignores RLIMIT_NPROC, and a script that escapes still owns nothing on the host. It never falls back
to root: the backend picks an interpreter that starts in the sandbox as `nobody`, and refuses to
start, naming the fix, when none does.

`unshare --net --map-root-user --pid` cuts the network and the PIDs but is *not* a filesystem
sandbox, and `unsafe-none` isolates nothing: both run scripts as the manager's own user (as root,
with no process limit), must be chosen explicitly, and are logged as UNSAFE every time a backend
starts with them.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from rockbot.contracts.scripts import INPUT_DIR, OUTPUT_DIR
from rockbot.scripts_manager.backends import SandboxUnavailable
from rockbot.scripts_manager.backends.job_dirs import FILES, OUTPUT, WORK

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
    "unshare": "no network, but the script runs as the manager's user and can read and write its files",
    "unsafe-none": "the script runs as a plain subprocess with the manager's rights and network",
}


class Interpreter(BaseModel):
    """The Python that runs scripts, and the directory tree it needs to see."""

    model_config = ConfigDict(frozen=True)

    executable: str
    prefix: str


class Sandboxed(NamedTuple):
    """How to start one script: the argv before its command, the descriptors it needs, where it sees things."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    #: Where the argv is started, on the host.
    cwd: Path
    job_dir: Path
    packages_dir: Path | None
    #: The script's writable working directory (also its HOME and TMPDIR), as it sees it.
    work_dir: Path
    #: The conversation's files (read-only) and the folder whose files come back, as the script sees them.
    input_dir: Path
    output_dir: Path


class Isolation(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: IsolationKind
    executable: str | None = None
    #: `setpriv`, when the manager is root and bubblewrap runs as `nobody`.
    setpriv: str | None = None

    @property
    def script_uid(self) -> int:
        """Who scripts run as on the host."""
        return NOBODY if self.setpriv is not None else os.geteuid()

    def sandbox(
        self, *, interpreter: Interpreter, job_dir: Path, job_fds: Mapping[str, int], packages_dir: Path | None,
        tmp_bytes: int, status_fd: int, input_fd: int, output_fd: int,
    ) -> Sandboxed:  # fmt: skip
        """bubblewrap gets the job's files as `job_fds` (by path in the job folder), its `/input` and `/output`
        folders as descriptors, and reports on `status_fd`."""
        if self.kind != "bwrap":
            prefix = [] if self.kind == "unsafe-none" else [
                str(self.executable), "--net", "--map-root-user", "--pid", "--fork", "--kill-child", "--"
            ]  # fmt: skip
            return Sandboxed(
                prefix, (), job_dir / WORK, job_dir, packages_dir, job_dir / WORK, job_dir / FILES, job_dir / OUTPUT
            )
        size = str(tmp_bytes)
        argv = [
            str(self.executable), "--unshare-all", "--unshare-user", "--disable-userns", "--uid", "65534",
            "--gid", "65534", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--as-pid-1",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            # Debian's numpy finds libblas.so.3 via /etc/alternatives; its matplotlib reads /etc/matplotlibrc, fonts.
            "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
            "--ro-bind-try", "/etc/matplotlibrc", "/etc/matplotlibrc", "--ro-bind-try", "/etc/fonts", "/etc/fonts",
            "--ro-bind-try", "/etc/localtime", "/etc/localtime",
            # Debian's shared libraries chosen by update-alternatives (numpy's libblas.so.3) are links through here.
            "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
            "--ro-bind-try", "/etc/matplotlibrc", "/etc/matplotlibrc",  # Debian's python3-matplotlib links it
            "--ro-bind-try", "/etc/fonts", "/etc/fonts",  # fontconfig's (matplotlib's fonts)
            "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm",
        ]  # fmt: skip
        if not interpreter.prefix.startswith("/usr/"):
            argv += ["--ro-bind", interpreter.prefix, interpreter.prefix]
        inner_packages = None
        if packages_dir is not None:
            argv += ["--ro-bind", str(packages_dir), str(SANDBOX_PACKAGES_DIR)]
            inner_packages = SANDBOX_PACKAGES_DIR
        for name, fd in job_fds.items():
            argv += ["--ro-bind-data", str(fd), str(SANDBOX_JOB_DIR / name)]
        argv += ["--ro-bind-fd", str(input_fd), INPUT_DIR, "--bind-fd", str(output_fd), OUTPUT_DIR]
        argv += [
            "--remount-ro", "/dev", "--remount-ro", "/", "--json-status-fd", str(status_fd), "--chdir", "/tmp", "--"
        ]  # fmt: skip
        if self.setpriv is not None:
            argv = [self.setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]
        fds = (*job_fds.values(), status_fd, input_fd, output_fd)
        return Sandboxed(
            argv, fds, Path("/"), SANDBOX_JOB_DIR, inner_packages, Path("/tmp"), Path(INPUT_DIR), Path(OUTPUT_DIR)
        )


def find(*, mode: Literal["auto", "bwrap", "unshare", "unsafe-none"], search_path: str | None = None) -> Isolation:
    """The isolation asked for (`auto` means bubblewrap), if its programs are installed; refuse clearly otherwise."""
    if mode == "unsafe-none":
        isolation = Isolation(kind="unsafe-none")
    else:
        kind: IsolationKind = "bwrap" if mode == "auto" else mode
        executable = shutil.which(kind, path=search_path)
        if executable is None:
            raise SandboxUnavailable(refusal(mode=mode, problem=f"{kind}: not installed"))
        setpriv = None
        if kind == "bwrap" and os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise SandboxUnavailable(refusal(mode=mode, problem="setpriv (util-linux) is needed to drop root"))
        isolation = Isolation(kind=kind, executable=executable, setpriv=setpriv)
    if isolation.kind in _WEAK:
        log.warning(
            "UNSAFE: ROCKBOT_SCRIPTS_LOCAL_ISOLATION=%s is not a sandbox (%s%s); use it only for trusted scripts, "
            "and install bubblewrap for anything else", isolation.kind, _WEAK[isolation.kind],
            ", as root, with no process limit" if os.geteuid() == 0 else "",
        )  # fmt: skip
    return isolation


def refusal(*, mode: str, problem: str) -> str:
    return f"ROCKBOT_SCRIPTS_LOCAL_ISOLATION={mode} cannot isolate local scripts here ({problem}): {_INSTALL_HINT}"
