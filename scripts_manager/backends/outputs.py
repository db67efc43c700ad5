"""What a script left under `/output`, as artifacts within bounds: read by the shared walk, then described.

The folder is read as a hostile one by `rockbot.scripts_manager.output_walk` (symlinks, hard links, odd names, too
many entries, files over the bounds: all dropped and said). The local backend walks it here, on the manager's side
(`collect`); a script pod's runner walks it with the same code inside the pod and sends the files on the attach
stream, which the manager takes back with `received`: the runner's answer is checked once more against the same
bounds and names (a runner that broke them is a broken protocol, never a file let through).

Only raster images are typed from their content (PNG, JPEG, GIF, WebP by their magic numbers); everything else is
typed from its name's extension and is never an image that a browser would show (an `x.png` holding HTML is
`application/octet-stream`).
"""

from __future__ import annotations

import binascii
from typing import Any, NamedTuple

from rockbot.contracts.scripts import ScriptArtifact
from rockbot.media import sniff
from rockbot.scripts_manager.output_walk import MAX_DROPS_NAMED, walk_output

PREVIEW_LINES = 5
PREVIEW_LINE_CHARS = 200
_TEXT = {"application/json", "application/xml", "application/x-ndjson"}
#: The longest sentence about a dropped file a runner may send (a name of 8 folders of 255 bytes, and why).
_MAX_DROP_CHARS = 4096


class OutputBounds(NamedTuple):
    files: int = 20
    file_bytes: int = 10 * 1024 * 1024
    total_bytes: int = 50 * 1024 * 1024


class Collected(NamedTuple):
    artifacts: tuple[ScriptArtifact, ...]
    dropped: tuple[str, ...]


def collect(folder_fd: int, *, bounds: OutputBounds) -> Collected:
    """The artifacts of the folder open as `folder_fd` (not closed here), in name order, and what was left out."""
    kept, drops = walk_output(folder_fd, bounds.files, bounds.file_bytes, bounds.total_bytes)
    return Collected(tuple(describe(name, content) for name, content in kept), tuple(drops))


def received(files: Any, drops: Any, *, bounds: OutputBounds) -> Collected:
    """The artifacts a script pod's runner sent (`[{"name", "content": base64}]` and its sentences of drops), checked
    again against `bounds`; ValueError if they break them or are not what a runner sends."""
    if not isinstance(files, list) or not isinstance(drops, list) or len(drops) > MAX_DROPS_NAMED + 1:
        raise ValueError("the runner's artifacts are not a list of files and a short list of drops")
    if len(files) > bounds.files:
        raise ValueError(f"the runner sent {len(files)} files, over the bound of {bounds.files}")
    artifacts, total = [], 0
    for item in files:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("content"),
                                                                                               str):
            raise ValueError("a file the runner sent has no name or content")
        try:
            content = binascii.a2b_base64(item["content"], strict_mode=True)
        except binascii.Error as exc:
            raise ValueError(f"a file the runner sent is not base64: {exc}") from None
        total += len(content)
        if len(content) > bounds.file_bytes or total > bounds.total_bytes:
            raise ValueError("the runner sent files over the bounds it was given")
        artifacts.append(describe(item["name"], content))  # the name is checked as a FileName here
    if not all(isinstance(drop, str) and len(drop) <= _MAX_DROP_CHARS for drop in drops):
        raise ValueError("a drop the runner sent is not a short sentence")
    return Collected(tuple(artifacts), tuple(drops))


def describe(name: str, content: bytes) -> ScriptArtifact:
    """The artifact of `content` named `name`: its sniffed type and, for text, its first lines."""
    media_type = sniff(name, content)
    preview = _preview(content) if media_type.startswith("text/") or media_type in _TEXT else ""
    return ScriptArtifact(name=name, media_type=media_type, size=len(content), preview=preview, content=content)


def _preview(content: bytes) -> str:
    lines = content[:8192].decode(errors="replace").splitlines()[:PREVIEW_LINES]
    kept = ("".join(c if c.isprintable() or c == "\t" else "?" for c in line)[:PREVIEW_LINE_CHARS] for line in lines)
    return "\n".join(kept)
