"""Where a Trigger's status lives: `KubeLedger` (the API server, written conditionally) or `MemoryLedger` (local).

A change is a function of (trigger, status) that edits the status in place and returns a result (see
`admission`). `KubeLedger` runs the changes waiting for one Trigger together, on the status as last
read or written, and merge-patches it only if it changed, with the resourceVersion it was read at:
so every delivery is decided on the stored status, a write that lost a race (another replica wrote
first: 409) is decided again on a fresh read, and a burst of deliveries costs one write per round
trip instead of one each (group commit). A change that edits nothing (a delivery seen before, an
event folded into its incident) costs no request at all.

Changes must be pure: a change may run more than once, only the run whose write lands counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from rockbot.kube import TRIGGERS, Conflict, KubeClient
from rockbot.resources.trigger import Trigger, TriggerStatus

log = logging.getLogger(__name__)

R = TypeVar("R")
Key = tuple[str, str]
Change = Callable[[Trigger, TriggerStatus], R]
#: Told after every round of changes (written or not): the trigger and its status as they now stand.
Written = Callable[[Key, Trigger, TriggerStatus], None]
WRITE_ATTEMPTS = 8


class Ledger(Protocol):
    async def change(self, key: Key, change: Change[R]) -> R:
        """Apply `change` to the Trigger's stored status and store the result; `NotFound` if it is gone."""
        ...

    def forget(self, key: Key) -> None:
        """The Trigger is gone: drop what is kept of it."""
        ...


def status_of(body: dict[str, Any]) -> TriggerStatus:
    """The stored status as a model; an unreadable one (edited by hand) starts afresh."""
    try:
        return TriggerStatus.model_validate(body.get("status") or {})
    except ValidationError:
        log.warning("Trigger %s/%s has an unreadable status; starting it afresh",
                    body["metadata"].get("namespace"), body["metadata"].get("name"))
        return TriggerStatus()


@dataclass
class _Known:
    """A Trigger as this process last read or wrote it, parsed (a stale copy costs one 409 and a read)."""

    body: dict[str, Any]
    trigger: Trigger
    status: TriggerStatus
    wire: dict[str, Any]


class KubeLedger:
    def __init__(self, *, kube: KubeClient, on_written: Written | None = None) -> None:
        self._kube = kube
        self._on_written = on_written
        self._known: dict[Key, _Known] = {}
        #: The newest generation of each Trigger seen anywhere (its watch): an older copy is read again.
        self._generations: dict[Key, int] = {}
        self._waiting: dict[Key, list[tuple[Change[Any], asyncio.Future[Any]]]] = {}
        self._committing: dict[Key, asyncio.Task[None]] = {}

    async def change(self, key: Key, change: Change[R]) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((change, future))
        if key not in self._committing:
            self._committing[key] = asyncio.create_task(self._commit_all(key), name=f"ledger {key[0]}/{key[1]}")
        return await asyncio.shield(future)  # a caller that gives up leaves the round to finish

    def forget(self, key: Key) -> None:
        self._known.pop(key, None)
        self._generations.pop(key, None)

    def observe(self, body: dict[str, Any]) -> None:
        """A copy of the Trigger from elsewhere (its watch): a newer spec means the kept copy may not decide."""
        metadata = body["metadata"]
        key = (metadata["namespace"], metadata["name"])
        self._generations[key] = max(self._generations.get(key, 0), int(metadata.get("generation") or 0))

    async def close(self) -> None:
        """Let the rounds in flight finish (their deliveries are being recorded)."""
        await asyncio.gather(*self._committing.values(), return_exceptions=True)

    async def _commit_all(self, key: Key) -> None:
        try:
            while self._waiting.get(key):
                round_ = self._waiting.pop(key)
                try:
                    results = await self._commit(key, [change for change, _ in round_])
                except Exception as exc:  # every caller of the round learns why (NotFound, Unavailable...)
                    for _, future in round_:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(round_, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            del self._committing[key]

    async def _commit(self, key: Key, changes: list[Change[Any]]) -> list[Any]:
        for _ in range(WRITE_ATTEMPTS):
            known = self._known.pop(key, None)  # the changes edit its status: it is only put back as it is stored
            if known is None or int(known.trigger.metadata.get("generation") or 0) < self._generations.get(key, 0):
                known = _parsed(await self._kube.get(TRIGGERS, namespace=key[0], name=key[1]))
            results = [change(known.trigger, known.status) for change in changes]
            after = known.status.to_wire()
            if after != known.wire:
                try:
                    body = await self._write(known.body, before=known.wire, after=after)
                except Conflict:
                    continue
                known = _parsed(body, trigger=known.trigger, status=known.status, wire=after)
            self._known[key] = known
            if self._on_written is not None:
                self._on_written(key, known.trigger, known.status)
            return results
        raise Conflict(status=409, reason="Conflict",
                       message=f"the status of Trigger {key[0]}/{key[1]} kept changing under {WRITE_ATTEMPTS} writes")

    async def _write(self, body: dict[str, Any], *, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status subresource, only if the object is still at the version it was read at."""
        metadata = body["metadata"]
        patch = {field: None for field in before if field not in after} | after
        return await self._kube.patch(
            TRIGGERS, namespace=metadata["namespace"], name=metadata["name"], subresource="status",
            body={"metadata": {"resourceVersion": metadata["resourceVersion"]}, "status": patch},
        )  # fmt: skip


def _parsed(
    body: dict[str, Any], *, trigger: Trigger | None = None, status: TriggerStatus | None = None,
    wire: dict[str, Any] | None = None,
) -> _Known:  # fmt: skip
    """`body` parsed; after a write, its status is the one just written (and so is the spec, same generation)."""
    metadata = body["metadata"]
    if trigger is None or (trigger.metadata.get("generation"), trigger.metadata.get("uid")) != (
        metadata.get("generation"), metadata.get("uid")
    ):
        trigger = Trigger.model_validate({**body, "status": None})
    if status is None or wire is None:
        status = status_of(body)
        wire = status.to_wire()
    return _Known(body=body, trigger=trigger, status=status, wire=wire)


class MemoryLedger:
    """Statuses kept in this process, for `rockbot local` (nothing else writes them)."""

    def __init__(self, *, on_written: Written | None = None) -> None:
        self._on_written = on_written
        self.triggers: dict[Key, Trigger] = {}
        self.statuses: dict[Key, TriggerStatus] = {}

    def add(self, trigger: Trigger) -> None:
        key = (trigger.metadata["namespace"], trigger.metadata["name"])
        self.triggers[key] = trigger
        self.statuses.setdefault(key, TriggerStatus())

    async def change(self, key: Key, change: Change[R]) -> R:
        trigger, status = self.triggers[key], self.statuses[key]
        result = change(trigger, status)
        if self._on_written is not None:
            self._on_written(key, trigger, status)
        return result

    def forget(self, key: Key) -> None:
        self.triggers.pop(key, None)
        self.statuses.pop(key, None)
