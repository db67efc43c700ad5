"""Local `pip_packages`: each distinct package set is installed once, into a content-addressed cache.

The cache key is a hash of the interpreter and the sorted canonical names, so a set is installed
the first time it is asked for and reused read-only afterwards (bind-mounted into the sandbox).
pip runs here, outside the sandbox, which keeps the sandbox network-less; it takes wheels only
(`--only-binary=:all:`), so no package's build code ever runs on the manager's host. It is the
manager's own pip (`--python` aims it at the scripts' interpreter, which may have none).

Whatever is in the cache runs inside every sandbox that asks for that set, so only the manager may
write it: the cache (by default /var/cache/rockbot/packages for root, else
`$XDG_CACHE_HOME/rockbot/packages`) must belong to the manager, and no folder above it may be
writable by another user unless sticky (like /tmp). `check` refuses any other cache before a
script runs, and each set is checked again before it is mounted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import stat
import sys
import uuid
from collections import defaultdict
from pathlib import Path

from packaging.utils import canonicalize_name

from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable


def default_root() -> Path:
    """Where the cache lives when ROCKBOT_SCRIPTS_PACKAGE_CACHE is not set: the manager's own cache folder."""
    if os.geteuid() == 0:
        return Path("/var/cache/rockbot/packages")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rockbot" / "packages"


class PackageCache:
    def __init__(self, *, root: Path, python: str, index_url: str | None, find_links: str | None) -> None:
        self._root = root
        self._python = python
        self._index_url = index_url
        self._find_links = find_links
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def check(self, *, reader_uid: int) -> None:
        """Create the cache if missing; refuse one another user could write, or `reader_uid` could not reach."""
        problem = _unsafe_folder(self._root, reader_uid=reader_uid)
        if problem is not None:
            raise SandboxUnavailable(
                f"ROCKBOT_SCRIPTS_PACKAGE_CACHE={self._root} cannot hold the packages scripts import ({problem}): "
                f"use a folder only the manager can write and every user can reach, such as {default_root()} "
                "(the default)"
            )

    def path_for(self, packages: tuple[str, ...]) -> Path:
        names = sorted({canonicalize_name(name) for name in packages})
        digest = hashlib.sha256(json.dumps({"python": self._python, "packages": names}).encode()).hexdigest()
        return self._root / digest[:32]

    async def ensure(self, packages: tuple[str, ...]) -> Path:
        """The directory holding exactly this package set, installing it on first use."""
        target = self.path_for(packages)
        async with self._locks[target.name]:
            if not await asyncio.to_thread(target.is_dir):
                await self._install(packages=sorted({canonicalize_name(n) for n in packages}), target=target)
        problem = await asyncio.to_thread(_not_the_managers, target)
        if problem is not None:
            raise SandboxFailure(f"the package set {target} is not the manager's ({problem}); remove it")
        return target

    async def _install(self, *, packages: list[str], target: Path) -> None:
        staging = self._root / f".{target.name}.{uuid.uuid4().hex[:8]}"
        sources: list[str] = []
        if self._find_links:
            sources += ["--no-index", "--find-links", self._find_links]
        elif self._index_url:
            sources += ["--index-url", self._index_url]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "pip", "--python", self._python, "install", "--target", str(staging),
            "--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--quiet",
            "--root-user-action=ignore", *sources, "--", *packages,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await process.communicate()
        if process.returncode != 0:
            await asyncio.to_thread(shutil.rmtree, staging, True)
            raise SandboxFailure(
                f"installing {', '.join(packages)} failed: {stderr.decode(errors='replace').strip()[-500:]}"
            )
        await asyncio.to_thread(_readable_by_all, staging)
        try:
            await asyncio.to_thread(staging.rename, target)
        except OSError:
            if not await asyncio.to_thread(target.is_dir):
                raise
            # Another manager sharing the cache installed the same set first: theirs is as good.
            await asyncio.to_thread(shutil.rmtree, staging, True)


def _unsafe_folder(root: Path, *, reader_uid: int) -> str | None:
    """Why `root` is no place for code scripts run, or None (then it exists, made if missing)."""
    existing = next(folder for folder in (root, *root.parents) if folder.exists())
    problem = _unsafe_path(existing.resolve(), reader_uid=reader_uid, ours=existing == root)
    if problem is not None or existing == root:
        return problem
    for folder in reversed(root.parents[: len(root.parents) - len(existing.parents) - 1]):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)  # whatever the umask
    root.mkdir(exist_ok=True)
    root.chmod(0o755)
    return _unsafe_path(root.resolve(), reader_uid=reader_uid, ours=True)


def _unsafe_path(path: Path, *, reader_uid: int, ours: bool) -> str | None:
    """Could anyone but root and the manager change `path` (the manager's if `ours`), or `reader_uid` not reach it?"""
    for folder in (*reversed(path.parents), path):
        info = folder.stat()
        mode = stat.S_IMODE(info.st_mode)
        leaf = ours and folder == path
        if info.st_uid not in {0, os.geteuid()} or (leaf and info.st_uid != os.geteuid()):
            return f"{folder} belongs to uid {info.st_uid}"
        if mode & 0o022 and (leaf or not mode & stat.S_ISVTX):
            return f"{folder} is writable by others (mode {mode:04o})"
        if reader_uid not in {0, info.st_uid} and not mode & 0o001:
            return f"scripts run as uid {reader_uid}, which cannot reach {folder} (mode {mode:04o})"
    return None


def _not_the_managers(target: Path) -> str | None:
    info = target.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return f"owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}"
    return None


def _readable_by_all(tree: Path) -> None:
    """Whatever the manager's umask: scripts (another user) read the set, nobody else writes it."""
    for folder, _, files in os.walk(tree):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
