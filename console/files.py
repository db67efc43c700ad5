"""The console keeps a conversation's files for agents: `SaveFiles` on `console.files`.

Which agent asks is the broker-validated sender, and the answer goes only to one of its own reply queues. Files
are kept only for the sender's own runs (`owns_run`: a run id starts with a digest of its agent), under the
conversation the agent names for that run (agent, caller, session), as it names it for the run's history. A
request the console cannot read is refused (dead-lettered), and so is one past the agent's `FILES_PER_AGENT`
being answered; a database that does not answer gets an error reply, so the tool result says the files were not
kept.
"""

from __future__ import annotations

import logging

from rockbot.bus import Bus
from rockbot.bus.identity import Principal
from rockbot.bus.topology import CONSOLE_FILES
from rockbot.console.agent_requests import AgentRequests
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.files import MAX_REQUEST_BYTES, FilesSaved, SavedFile, SaveFiles
from rockbot.contracts.recording import owns_run

log = logging.getLogger(__name__)

#: File requests of one agent answered at once; its others are refused meanwhile.
FILES_PER_AGENT = 2


class FileAnswerer(AgentRequests):
    """Answers `console.files`; `start()`, then `stop()`."""

    what, queue, prefetch, per_agent = "file", CONSOLE_FILES, 8, FILES_PER_AGENT
    max_bytes, request_type = MAX_REQUEST_BYTES, SaveFiles

    def __init__(self, *, files: FileStore, bus: Bus) -> None:
        super().__init__(bus=bus)
        self._files = files

    async def answer(self, agent: Principal, request: SaveFiles) -> FilesSaved:
        return await save_files(self._files, namespace=agent.namespace, agent=agent.name, request=request)


async def save_files(files: FileStore, *, namespace: str, agent: str, request: SaveFiles) -> FilesSaved:
    """Keep the files of one of the agent's own runs (the agent as validated, never a field of the request)."""
    if not owns_run(request.run_id, namespace=namespace, agent=agent):
        return FilesSaved(error=f"run {request.run_id} is not one of agent {namespace}/{agent}'s runs")
    owner = FileOwner(namespace=namespace, agent=agent, caller=request.caller, session_id=request.session_id)
    saved = []
    try:
        for file in request.files:
            stored = await files.save(owner=owner, name=file.name, content=file.content, origin="script",
                                      run_id=request.run_id, retention_days=request.retention_days)  # fmt: skip
            saved.append(SavedFile(id=stored.id, name=stored.name, media_type=stored.media_type, size=stored.size))
    except StoreUnavailable as exc:
        log.warning("cannot keep files of %s/%s: %s", namespace, agent, exc)
        return FilesSaved(files=saved, error="the run store is unavailable; the files were not kept")
    return FilesSaved(files=saved)
