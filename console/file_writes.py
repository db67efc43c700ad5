"""The console keeps the artifacts the scripts-manager writes for a call (those too large for the call's answer):
`WriteFile` on `console.file-writes`, a chunk at a time, answered with `FileWritten` on the manager's own reply queue.

Only `service.scripts-manager` may write (the broker validates the sender). It names the agent as the broker
validated the script request's sender, and the run and conversation that request named; the console keeps a chunk
only for one of that agent's own runs (`owns_run`), under that conversation, and a file is seen by nobody until its
last chunk is stored (`FileStore.write_part`).
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError

from rockbot.bus.identity import Principal
from rockbot.bus.topology import CONSOLE_FILE_WRITES
from rockbot.console.file_reads import ManagerFileRequests
from rockbot.console.file_store import FileOwner, FileStore, Part
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.files import MAX_WRITE_REQUEST_BYTES, FileWritten, WriteFile
from rockbot.contracts.recording import owns_run

log = logging.getLogger(__name__)

#: Chunks written at once (all of them the scripts-manager's), each up to 4 MiB held in memory.
WRITES_AT_ONCE = 4


class FileWriteAnswerer(ManagerFileRequests):
    """Answers `console.file-writes`; `start()`, then `stop()`."""

    what, queue, prefetch, per_agent = "file write", CONSOLE_FILE_WRITES, WRITES_AT_ONCE, WRITES_AT_ONCE
    max_bytes, request_type = MAX_WRITE_REQUEST_BYTES, WriteFile

    async def answer(self, agent: Principal, request: WriteFile) -> FileWritten:
        return await write_chunk(self._files, request)


async def write_chunk(files: FileStore, request: WriteFile) -> FileWritten:
    """Store the chunk when its run is the named agent's; the file's id, and whether it is whole now."""
    if not owns_run(request.run_id, namespace=request.namespace, agent=request.agent):
        return FileWritten(error=f"run {request.run_id} is not one of agent {request.namespace}/{request.agent}'s "
                                 "runs")  # fmt: skip
    owner = FileOwner(namespace=request.namespace, agent=request.agent, caller=request.caller,
                      session_id=request.session_id)  # fmt: skip
    part = Part(owner=owner, run_id=request.run_id, name=request.name, size=request.size, offset=request.offset,
                file_id=request.file_id, retention_days=request.retention_days)  # fmt: skip
    try:
        stored = await files.write_part(part, request.content)
    except (StoreUnavailable, IntegrityError) as exc:
        log.warning("cannot keep a chunk of %s for %s/%s: %s", request.name, request.namespace, request.agent, exc)
        return FileWritten(error="the run store is unavailable; the file was not kept")
    if stored.problem:
        return FileWritten(error=stored.problem)
    return FileWritten(id=stored.id, stored=stored.stored, complete=stored.complete)
