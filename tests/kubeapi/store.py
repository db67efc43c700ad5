"""Object storage with one resourceVersion counter, a bounded change history, and live watchers.

Every mutation is synchronous (no `await` inside), so on the event loop it is atomic: a watch
that takes its snapshot and subscribes in one synchronous step can never miss a change, which is
what the real server guarantees with its watch cache.
"""

import asyncio
import collections
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.kubeapi.errors import StatusError, gone

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)


@dataclass(frozen=True, kw_only=True)
class Change:
    """One stored change; `old` is the state before a MODIFIED change (for selector transitions)."""

    rv: int
    key: Key
    type: str
    obj: Obj
    old: Obj | None = None


@dataclass(kw_only=True, eq=False)
class Watcher:
    """A live subscription: changes of one resource land in `queue`; `None` ends the stream."""

    key: Key
    matches: Callable[[Obj], bool]
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)

    def translate(self, change: Change) -> tuple[str, Obj] | None:
        """The event this watcher sees: an object entering or leaving the selection is ADDED or DELETED."""
        now = self.matches(change.obj)
        if change.type != "MODIFIED":
            return (change.type, change.obj) if now else None
        before = change.old is not None and self.matches(change.old)
        if now and before:
            return ("MODIFIED", change.obj)
        if now:
            return ("ADDED", change.obj)
        if before:
            return ("DELETED", change.obj)
        return None


class Store:
    """Objects by resource and (namespace, name); each write gets the next global resourceVersion."""

    def __init__(self, *, history_limit: int) -> None:
        self._objects: dict[Key, dict[tuple[str | None, str], Obj]] = collections.defaultdict(dict)
        self._history: collections.deque[Change] = collections.deque(maxlen=history_limit)
        self._compacted = 0  # the newest resourceVersion no longer in the history
        self._watchers: set[Watcher] = set()
        self.rv = 1

    def get(self, key: Key, namespace: str | None, name: str) -> Obj | None:
        return self._objects[key].get((namespace, name))

    def items(self, key: Key, namespace: str | None = None) -> list[Obj]:
        """Objects of a resource, in one namespace or all, sorted as the server sorts (namespace, name)."""
        found = [
            obj for (ns, _), obj in self._objects[key].items() if namespace is None or ns == namespace
        ]
        return sorted(found, key=lambda obj: (obj["metadata"].get("namespace") or "", obj["metadata"]["name"]))

    def everything(self) -> Iterator[tuple[Key, Obj]]:
        for key, objects in list(self._objects.items()):
            for obj in list(objects.values()):
                yield key, obj

    def write(self, key: Key, obj: Obj, *, type: str, old: Obj | None = None) -> Obj:
        """Store a new state (ADDED or MODIFIED) under the next resourceVersion; returns what was stored."""
        self.rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        meta = stored["metadata"]
        self._objects[key][(meta.get("namespace"), meta["name"])] = stored
        self._record(Change(rv=self.rv, key=key, type=type, obj=stored, old=old))
        return stored

    def remove(self, key: Key, obj: Obj) -> Obj:
        """Remove an object for good: watchers see DELETED with the deletion's resourceVersion."""
        self.rv += 1
        meta = obj["metadata"]
        del self._objects[key][(meta.get("namespace"), meta["name"])]
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = str(self.rv)
        self._record(Change(rv=self.rv, key=key, type="DELETED", obj=final))
        return final

    def _record(self, change: Change) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(change)
        for watcher in list(self._watchers):
            if watcher.key == change.key:
                watcher.queue.put_nowait(change)

    def subscribe(self, watcher: Watcher, *, since: int | None) -> list[Change]:
        """Subscribe, returning the changes to replay first: current objects as ADDED, or history after `since`."""
        if since is None:
            replay = [Change(rv=self.rv, key=watcher.key, type="ADDED", obj=obj) for obj in self.items(watcher.key)]
        elif since < self._compacted:
            raise gone(f"too old resource version: {since} ({self._compacted + 1})")
        elif since > self.rv:
            raise StatusError(
                code=504, reason="Timeout", message=f"Too large resource version: {since}, current: {self.rv}"
            )
        else:
            replay = [change for change in self._history if change.rv > since and change.key == watcher.key]
        self._watchers.add(watcher)
        return replay

    def compact(self) -> None:
        """Forget the history up to now, as etcd compaction does: older watches get 410 Gone."""
        self._compacted = self.rv
        self._history.clear()

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def end_watches(self) -> None:
        """End every open watch stream (as an API server does when it shuts down)."""
        for watcher in list(self._watchers):
            watcher.queue.put_nowait(None)
        self._watchers.clear()
