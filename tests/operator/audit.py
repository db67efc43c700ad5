"""A real API server's audit log (the rig's: JSON lines, Metadata level), read as it grows.

Tests and the operator benchmark count requests per user from it: the API server's own word on what
a client asked, whatever the client believes it sent. The rig's log is shared and large, so it is read
from where it ended when the reader was made, a new part at a time, keeping only one namespace's
events (and those of users named after it, such as its ServiceAccounts, wherever they went).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITE_VERBS = ("create", "update", "patch", "delete")


@dataclass(frozen=True)
class AuditEvent:
    verb: str  # get, list, watch, create, update, patch, delete
    resource: str  # with its subresource: "agents/status"
    name: str
    namespace: str
    user: str
    received: datetime.datetime

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    @classmethod
    def of(cls, event: dict[str, Any]) -> AuditEvent:
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        return cls(verb=event["verb"], resource=resource, name=ref.get("name", ""),
                   namespace=ref.get("namespace", ""), user=event["user"]["username"],
                   received=datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")))


class AuditLog:
    """The completed requests (stage ResponseComplete) about `namespace` logged after this reader was made.

    `stage="ResponseStarted"`: the watches begun instead (a watch completes only when it ends).
    """

    def __init__(self, path: Path, *, namespace: str, stage: str = "ResponseComplete") -> None:
        self._path = path
        self._namespace = namespace
        self._stage = f'"{stage}"'.encode()
        self._offset = path.stat().st_size if path.exists() else 0
        self._inode = path.stat().st_ino if path.exists() else None
        self.events: list[AuditEvent] = []

    def read(self) -> list[AuditEvent]:
        """Take what was logged since the last read; every event so far.

        The API server rotates its log (the rig keeps 200 MB a file, renamed `audit-<time>.log` beside it):
        the rest of the file read so far is taken from its new name first, then the new file from its start.
        """
        if not self._path.exists():
            return self.events
        inode = self._path.stat().st_ino
        if self._inode is not None and inode != self._inode:
            renamed = [old for old in self._path.parent.glob(f"{self._path.stem}-*{self._path.suffix}")
                       if old.stat().st_ino == self._inode]  # fmt: skip
            if renamed:
                self._take(renamed[0], self._offset)
            self._offset = 0
        self._inode = inode
        self._offset = self._take(self._path, self._offset)
        return self.events

    def _take(self, path: Path, offset: int) -> int:
        """Keep the events of `path`'s complete lines from `offset`; the offset after them."""
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read()
        end = data.rfind(b"\n") + 1
        mark = self._namespace.encode()
        for line in data[:end].splitlines():
            if mark in line and self._stage in line:
                event = AuditEvent.of(json.loads(line))
                if event.namespace == self._namespace or self._namespace in event.user:
                    self.events.append(event)
        return offset + end
