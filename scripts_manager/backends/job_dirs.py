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
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: Not the `rockbot-script-` of managers before the lock: their running jobs cannot be told from leftovers.
PREFIX = "rockbot-job-"
#: The files of a job folder, relative to it.
SCRIPT = "script.py"
INPUT = "input"
HOOK = "hook/sitecustomize.py"
#: The writable working directory of the weak isolations (bubblewrap has its own /tmp).
WORK = "tmp"
#: The conversation's files (read-only for the script) and the folder its artifacts are read back from.
FILES = "files"
OUTPUT = "output"


class JobDir:
    """One run's folder, locked until `remove`."""

    def __init__(self, path: Path, lock: int) -> None:
        self.path = path
        self._lock = lock

    @classmethod
    def write(
        cls, *, script: str, input_data: str | None, hook: str, files: Sequence[tuple[str, bytes]] = (),
        script_uid: int | None = None,
    ) -> JobDir:  # fmt: skip
        """`files` go under `input/` (mode 0644, in folders 0755), and `output/` is made for `script_uid` to write."""
        path = Path(tempfile.mkdtemp(prefix=PREFIX))
        lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_EX)  # before any file: see `reap`
        job = cls(path, lock)
        try:
            (path / SCRIPT).write_text(script, encoding="utf-8")
            (path / INPUT).write_text(input_data or "", encoding="utf-8")
            (path / HOOK).parent.mkdir()
            (path / HOOK).write_text(hook, encoding="utf-8")
            (path / WORK).mkdir(0o700)
            for private in (SCRIPT, INPUT, HOOK, HOOK.partition("/")[0]):
                os.chmod(path / private, 0o700 if private == HOOK.partition("/")[0] else 0o600)
            _write_files(path / FILES, files)
            (path / OUTPUT).mkdir(0o700)
            if script_uid is not None and script_uid != os.geteuid():
                # bubblewrap, run as the script's user, binds `files/` and `output/`: its group (nobody's own) may
                # pass through the folder, never list it or read anything else in it.
                os.chown(path / OUTPUT, script_uid, script_uid)
                os.chown(path, -1, script_uid)
                os.chmod(path, 0o710)
        except BaseException:
            job.remove()
            raise
        return job

    def replace_files(self, files: Sequence[tuple[str, bytes]]) -> None:
        """A session's next call: its files replace the last call's under `input/` (the same folder, which the
        sandbox has bound), and `output/` is emptied so the call's artifacts are what it wrote."""
        for folder in (self.path / FILES, self.path / OUTPUT):
            _open_up(folder)
            for entry in os.scandir(folder):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        _write_files(self.path / FILES, files)

    def remove(self) -> None:
        _open_up(self.path / OUTPUT)
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)


def _write_files(folder: Path, files: Sequence[tuple[str, bytes]]) -> None:
    """Each file at its relative name (checked by the contract: no `..`, no absolute names), readable by all."""
    folder.mkdir(0o755, exist_ok=True)
    for name, content in files:
        target = folder / name
        for parent in reversed(target.relative_to(folder).parents[:-1]):
            (folder / parent).mkdir(0o755, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chmod(target, 0o644)  # whatever the umask
    for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        os.chmod(sub, 0o755)


def _open_up(folder: Path) -> None:
    """Make the folders a script left (it may have made some unwritable) removable by us; links are not followed."""
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o700)
    for parent, names, _ in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(path := os.path.join(parent, name)).st_mode):
                    os.chmod(path, 0o700)


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
