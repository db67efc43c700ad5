"""What a script left under `/output`, read back by the manager as a hostile folder: artifacts within bounds.

The folder is the script's: every name in it, every kind of entry and every size was chosen by it. So it is walked
by descriptor (`dir_fd`, `O_NOFOLLOW`), never by path: a symlink is never followed and is dropped, anything but a
regular file or folder is dropped, a file with more than one link (a hard link to something elsewhere) is dropped,
and a name with control characters, or one that is not UTF-8, is dropped. Names come back as relative paths
(`charts/a.png`); they are labels for people and the model, never paths on any host. At most `MAX_ENTRIES` entries
are looked at, so a script that leaves 10,000,000 files costs the manager a bounded walk.

Bounds (an Agent may lower them): `files` artifacts, `file_bytes` each, `total_bytes` together; a file over a bound
is dropped, and every drop is said in `dropped` (a sentence per file, the rest counted), never silently.

Only raster images are typed from their content (PNG, JPEG, GIF, WebP by their magic numbers); everything else is
typed from its name's extension and is never an image that a browser would show (an `x.png` holding HTML is
`application/octet-stream`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import NamedTuple

from rockbot.contracts.scripts import ScriptArtifact
from rockbot.media import sniff

#: Entries (files and folders) looked at in one output folder at most.
MAX_ENTRIES = 100_000
#: How deep folders under `/output` are walked.
MAX_DEPTH = 8
#: Drops named one by one; the rest are counted.
MAX_DROPS_NAMED = 10
PREVIEW_LINES = 5
PREVIEW_LINE_CHARS = 200
_TEXT = {"application/json", "application/xml", "application/x-ndjson"}


class OutputBounds(NamedTuple):
    files: int = 20
    file_bytes: int = 10 * 1024 * 1024
    total_bytes: int = 50 * 1024 * 1024


class Collected(NamedTuple):
    artifacts: tuple[ScriptArtifact, ...]
    dropped: tuple[str, ...]


def collect(folder_fd: int, *, bounds: OutputBounds) -> Collected:
    """The artifacts of the folder open as `folder_fd` (not closed here), in name order, and what was left out."""
    drops: list[str] = []
    opened: list[int] = []
    seen = 0
    try:
        files: list[tuple[str, int, int]] = []  # name, folder fd, size
        pending = [("", folder_fd, 0)]
        while pending:
            prefix, fd, depth = pending.pop()
            with os.scandir(fd) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        drops.append(f"more than {MAX_ENTRIES:,} entries: the rest were not looked at")
                        pending.clear()
                        break
                    name = prefix + entry.name
                    if (problem := _name_problem(entry.name)) is not None:
                        drops.append(f"{_shown(name)}: {problem}")
                        continue
                    info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
                        with contextlib.suppress(OSError):
                            inner = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                            opened.append(inner)
                            pending.append((name + "/", inner, depth + 1))
                        continue
                    if not stat.S_ISREG(info.st_mode):
                        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                        drops.append(f"{name}: {kind} (only files written under /output come back)")
                    elif info.st_nlink != 1:
                        drops.append(f"{name}: a hard link (only files written under /output come back)")
                    else:
                        files.append((name, fd, info.st_size))
        files.sort()
        artifacts: list[ScriptArtifact] = []
        total = 0
        for name, fd, size in files:
            if len(artifacts) >= bounds.files:
                drops.append(f"{name}: over the bound of {bounds.files} files")
            elif size > bounds.file_bytes:
                drops.append(f"{name}: {size:,} bytes, over the bound of {bounds.file_bytes:,} bytes per file")
            elif total + size > bounds.total_bytes:
                drops.append(f"{name}: {size:,} bytes would pass the bound of {bounds.total_bytes:,} bytes per call")
            elif (content := _read(fd, name.rpartition("/")[2], limit=bounds.file_bytes)) is None:
                drops.append(f"{name}: changed or unreadable while it was read")
            else:
                total += len(content)
                artifacts.append(describe(name, content))
        return Collected(tuple(artifacts), _summary(drops))
    finally:
        for fd in opened:
            os.close(fd)


def describe(name: str, content: bytes) -> ScriptArtifact:
    """The artifact of `content` named `name`: its sniffed type and, for text, its first lines."""
    media_type = sniff(name, content)
    preview = _preview(content) if media_type.startswith("text/") or media_type in _TEXT else ""
    return ScriptArtifact(name=name, media_type=media_type, size=len(content), preview=preview, content=content)


def _preview(content: bytes) -> str:
    lines = content[:8192].decode(errors="replace").splitlines()[:PREVIEW_LINES]
    kept = ("".join(c if c.isprintable() or c == "\t" else "?" for c in line)[:PREVIEW_LINE_CHARS] for line in lines)
    return "\n".join(kept)


def _name_problem(name: str) -> str | None:
    try:
        encoded = name.encode()
    except UnicodeEncodeError:
        return "the name is not UTF-8"
    if any(not ch.isprintable() for ch in name):
        return "the name holds control characters"
    if len(encoded) > 255:
        return "the name is longer than 255 bytes"
    return None


def _shown(name: str) -> str:
    """A dropped name as it may be printed: control characters as `?`, and not too long."""
    safe = name.encode(errors="replace").decode(errors="replace")
    return "".join(ch if ch.isprintable() else "?" for ch in safe)[:80]


def _read(folder_fd: int, name: str, *, limit: int) -> bytes | None:
    """The regular file `name` in the folder, read through a descriptor that follows nothing; None if it is no longer
    one regular file of at most `limit` bytes."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > limit:
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, min(1024 * 1024, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return None
        return b"".join(chunks)
    finally:
        os.close(fd)


def _summary(drops: list[str]) -> tuple[str, ...]:
    if len(drops) <= MAX_DROPS_NAMED:
        return tuple(drops)
    return (*drops[:MAX_DROPS_NAMED], f"and {len(drops) - MAX_DROPS_NAMED:,} more files left out")
