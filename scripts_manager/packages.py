"""Local `pip_packages`: each distinct package set is installed once, into a content-addressed cache.

The cache key is a hash of the interpreter and the sorted canonical names, so a set is installed
the first time it is asked for and reused read-only afterwards (bind-mounted into the sandbox).
pip runs here, outside the sandbox, which keeps the sandbox network-less; it takes wheels only
(`--only-binary=:all:`), so no package's build code ever runs on the manager's host.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import uuid
from collections import defaultdict
from pathlib import Path

from packaging.utils import canonicalize_name

from rockbot.scripts_manager.backends import SandboxFailure


class PackageCache:
    def __init__(self, *, root: Path, python: str, index_url: str | None, find_links: str | None) -> None:
        self._root = root
        self._python = python
        self._index_url = index_url
        self._find_links = find_links
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

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
        return target

    async def _install(self, *, packages: list[str], target: Path) -> None:
        staging = self._root / f".{target.name}.{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(self._root.mkdir, parents=True, exist_ok=True)
        sources: list[str] = []
        if self._find_links:
            sources += ["--no-index", "--find-links", self._find_links]
        elif self._index_url:
            sources += ["--index-url", self._index_url]
        process = await asyncio.create_subprocess_exec(
            self._python, "-m", "pip", "install", "--target", str(staging), "--only-binary=:all:",
            "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--quiet", *sources, "--", *packages,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await process.communicate()
        if process.returncode != 0:
            await asyncio.to_thread(shutil.rmtree, staging, True)
            raise SandboxFailure(
                f"installing {', '.join(packages)} failed: {stderr.decode(errors='replace').strip()[-500:]}"
            )
        await asyncio.to_thread(staging.chmod, 0o755)
        try:
            await asyncio.to_thread(staging.rename, target)
        except OSError:
            if not await asyncio.to_thread(target.is_dir):
                raise
            # Another manager sharing the cache installed the same set first: theirs is as good.
            await asyncio.to_thread(shutil.rmtree, staging, True)
