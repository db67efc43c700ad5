"""The console gives the scripts-manager the conversation files a script request names: `ReadFile` on
`console.file-reads`, answered with a `FileChunk` on the manager's own reply queue.

Only `service.scripts-manager` may ask (the broker validates the sender). It names the agent as the broker
validated the script request's sender, and the conversation (caller, session) that request named; a file is read
only when it belongs to exactly that conversation (`FileStore.read`), and any other id is answered `NOT_FOUND`,
whether or not it exists elsewhere, so the answer tells nothing of other conversations.
"""

from __future__ import annotations

import logging

from rockbot.bus import Bus, Delivery
from rockbot.bus.identity import SCRIPTS_MANAGER, Principal
from rockbot.bus.topology import CONSOLE_FILE_READS, service_replies_prefix
from rockbot.console.agent_requests import AgentRequests
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.files import CHUNK_BYTES, MAX_READ_BYTES, NOT_FOUND, FileChunk, ReadFile

log = logging.getLogger(__name__)

#: File reads answered at once (all of them the scripts-manager's): as many as are taken, so none is refused.
READS_AT_ONCE = 16


class ManagerFileRequests(AgentRequests):
    """Requests about conversation files that only the scripts-manager sends (reads here, writes in file_writes)."""

    askers = "the scripts-manager"

    def __init__(self, *, files: FileStore, bus: Bus) -> None:
        super().__init__(bus=bus)
        self._files = files

    def asker(self, delivery: Delivery) -> Principal | None:
        return from_scripts_manager(delivery)


class FileReadAnswerer(ManagerFileRequests):
    """Answers `console.file-reads`; `start()`, then `stop()`."""

    what, queue, prefetch, per_agent = "file read", CONSOLE_FILE_READS, READS_AT_ONCE, READS_AT_ONCE
    max_bytes, request_type = MAX_READ_BYTES, ReadFile

    async def answer(self, agent: Principal, request: ReadFile) -> FileChunk:
        return await read_chunk(self._files, request)


def from_scripts_manager(delivery: Delivery) -> Principal | None:
    """The scripts-manager, when it sent `delivery` and is answered on one of its own reply queues; else None."""
    if delivery.sender != SCRIPTS_MANAGER:
        return None
    if not (delivery.reply_to or "").startswith(service_replies_prefix(SCRIPTS_MANAGER.name)):
        return None
    return SCRIPTS_MANAGER


async def read_chunk(files: FileStore, request: ReadFile) -> FileChunk:
    """`CHUNK_BYTES` of the file from `request.offset`, when it is the named conversation's; `NOT_FOUND` otherwise."""
    owner = FileOwner(namespace=request.namespace, agent=request.agent, caller=request.caller,
                      session_id=request.session_id)  # fmt: skip
    try:
        found = await files.read(request.file_id, owner=owner)
    except StoreUnavailable as exc:
        log.warning("cannot read file %s of %s/%s: %s", request.file_id, request.namespace, request.agent, exc)
        return FileChunk(error="the run store is unavailable; the conversation's files cannot be read now")
    if found is None:
        return FileChunk(error=NOT_FOUND)
    stored, content = found
    return FileChunk(id=stored.id, name=stored.name, media_type=stored.media_type, size=stored.size,
                     offset=request.offset, content=content[request.offset:request.offset + CHUNK_BYTES])  # fmt: skip
