"""A local run's files in a folder of its own: private to the manager, locked while used, never left behind.

Each run gets a fresh folder (mode 0700) in the manager's temporary directory (`$TMPDIR`, else
/tmp), so no other local user can read its script or input: bubblewrap is handed the files as
descriptors, and the weak isolations run scripts as the manager's own user. The folder holds an
exclusive `flock` from before anything is written into it until it is removed; a manager killed
with SIGKILL leaves it unlocked, and the next manager of the same user to start removes it
(`reap`). A folder with files in it and no lock can only be such a leftover, so two managers
sharing a temporary directory never remove each other's running jobs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

#: Not the `rockbot-script-` of managers before the lock: their running jobs cannot be told from leftovers.
PREFIX = "rockbot-job-"
#: The files of a job folder, relative to it.
SCRIPT = "script.py"
INPUT = "input"
HOOK = "hook/sitecustomize.py"
#: The writable working directory of the weak isolations (bubblewrap has its own /tmp).
WORK = "tmp"


class JobDir:
    """One run's folder, locked until `remove`."""

    def __init__(self, path: Path, lock: int) -> None:
        self.path = path
        self._lock = lock

    @classmethod
    def write(cls, *, script: str, input_data: str | None, hook: str) -> JobDir:
        path = Path(tempfile.mkdtemp(prefix=PREFIX))
        lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_EX)  # before any file: see `reap`
        job = cls(path, lock)
        try:
            (path / SCRIPT).write_text(script, encoding="utf-8")
            (path / INPUT).write_text(input_data or "", encoding="utf-8")
            (path / HOOK).parent.mkdir()
            (path / HOOK).write_text(hook, encoding="utf-8")
            (path / WORK).mkdir()
        except BaseException:
            job.remove()
            raise
        return job

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)


def reap() -> list[str]:
    """Remove the job folders this user's killed managers left in the temporary directory; their names."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            if _remove_if_abandoned(path):
                removed.append(path.name)
    return removed


def _remove_if_abandoned(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live manager's run
        if not os.listdir(fd):
            return False  # just made: its writer locks it before writing anything
        shutil.rmtree(path)
        return True
    finally:
        os.close(fd)
