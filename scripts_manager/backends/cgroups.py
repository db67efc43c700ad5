"""A memory cgroup per local script, where the manager may make one: root, with a cgroup v1 memory hierarchy.

RLIMIT_AS holds each process to ROCKBOT_SCRIPTS_MEMORY, so a script of 8 processes could hold 8
times that, plus what it writes to its tmpfs mounts. A memory cgroup holds them all together, as a
pod's does: over the limit the kernel's OOM killer kills one of the script's processes, and the
cgroup's `oom_kill` count says so. Each run gets its own cgroup (named like its job folder) inside
the manager's own memory cgroup; the script joins it through `sh` before anything else starts, so
no Python code runs between fork and exec.

Where the manager cannot make one (not root, or a cgroup v2 host: enabling the memory controller
below the manager's own cgroup needs a delegated subtree, such as a systemd unit with
`Delegate=yes`, which this does not attempt), `find` returns None and memory stays limited per
process only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

_V1_MEMORY = Path("/sys/fs/cgroup/memory")
_EMPTY_WAIT_SECONDS = 2.0


class MemoryCgroups:
    """Makes, reads and removes the per-run cgroups below `base` (the manager's own memory cgroup)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def find(cls) -> MemoryCgroups | None:
        """The manager's v1 memory cgroup, if it may make children there (tried, not guessed); else None."""
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "memory" not in controllers.split(","):
                continue
            base = _V1_MEMORY / path.lstrip("/")
            probe = base / f"rockbot-probe-{os.getpid()}"
            try:
                probe.mkdir()
                (probe / "memory.limit_in_bytes").write_text(str(1 << 30))
            except OSError:
                return None
            finally:
                with contextlib.suppress(OSError):
                    probe.rmdir()
            return cls(base)
        return None

    def create(self, name: str, *, limit_bytes: int) -> Path:
        cgroup = self.base / name
        cgroup.mkdir()
        (cgroup / "memory.limit_in_bytes").write_text(str(limit_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing more to hold
            (cgroup / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        return cgroup

    @staticmethod
    def join(cgroup: Path) -> list[str]:
        """The argv prefix that moves the command into `cgroup` before it starts (or exits non-zero)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs")]

    @staticmethod
    def oom_kills(cgroup: Path) -> int:
        for line in (cgroup / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    async def remove(self, cgroup: Path) -> None:
        """Kill what is left in `cgroup` (a sandbox takes a moment to go) and remove it, if it exists."""
        deadline = asyncio.get_running_loop().time() + _EMPTY_WAIT_SECONDS
        while True:
            try:
                return await asyncio.to_thread(_kill_and_remove, cgroup)
            except OSError as exc:
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("could not remove the script's memory cgroup %s: %s", cgroup, exc)
                    return
                await asyncio.sleep(0.001)


def _kill_and_remove(cgroup: Path) -> None:
    try:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    except FileNotFoundError:
        return
    cgroup.rmdir()
