"""The console keeps a conversation's files for agents, and lists them: `SaveFiles` and `ListFiles` on `console.files`.

Which agent asks is the broker-validated sender, and the answer goes only to one of its own reply queues. Files
are kept only for the sender's own runs (`owns_run`: a run id starts with a digest of its agent), under the
conversation the agent names for that run (agent, caller, session), as it names it for the run's history. A
request the console cannot read is refused (dead-lettered), and so is one past the agent's `FILES_PER_AGENT`
being answered; a database that does not answer gets an error reply, so the tool result says the files were not
kept.
"""

from __future__ import annotations

import logging
from typing import Annotated

from pydantic import Field, TypeAdapter

from rockbot.bus import Bus
from rockbot.bus.identity import Principal
from rockbot.bus.topology import CONSOLE_FILES
from rockbot.console.agent_requests import AgentRequests
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.files import (
    MAX_FILES_PER_CONVERSATION,
    MAX_REQUEST_BYTES,
    MAX_UPLOAD_BYTES,
    FilesListed,
    FilesSaved,
    ListFiles,
    SavedFile,
    SaveFiles,
)
from rockbot.contracts.recording import owns_run

log = logging.getLogger(__name__)

_REQUEST: TypeAdapter[SaveFiles | ListFiles] = TypeAdapter(
    Annotated[SaveFiles | ListFiles, Field(discriminator="kind")])

#: File requests of one agent answered at once; its others are refused meanwhile.
FILES_PER_AGENT = 2


class FileAnswerer(AgentRequests):
    """Answers `console.files`; `start()`, then `stop()`."""

    what, queue, prefetch, per_agent = "file", CONSOLE_FILES, 8, FILES_PER_AGENT
    max_bytes, request_type = MAX_REQUEST_BYTES, _REQUEST

    def __init__(self, *, files: FileStore, bus: Bus) -> None:
        super().__init__(bus=bus)
        self._files = files

    async def answer(self, agent: Principal, request: SaveFiles | ListFiles) -> FilesSaved | FilesListed:
        if isinstance(request, ListFiles):
            return await list_files(self._files, namespace=agent.namespace, agent=agent.name, request=request)
        return await save_files(self._files, namespace=agent.namespace, agent=agent.name, request=request)


async def save_files(files: FileStore, *, namespace: str, agent: str, request: SaveFiles) -> FilesSaved:
    """Keep files under one of the agent's conversations (the agent as validated, never a field of the request): a
    script's only with one of its own runs, a person's within the upload bounds."""
    if request.run_id is not None and not owns_run(request.run_id, namespace=namespace, agent=agent):
        return FilesSaved(error=f"run {request.run_id} is not one of agent {namespace}/{agent}'s runs")
    owner = FileOwner(namespace=namespace, agent=agent, caller=request.caller, session_id=request.session_id)
    saved = []
    try:
        # What people and models add is bounded per conversation; a script's output per call (its bounds).
        held = 0 if request.origin == "script" else len(await files.conversation(owner=owner))
        if held + len(request.files) > MAX_FILES_PER_CONVERSATION and request.origin != "script":
            return FilesSaved(error=f"this conversation holds {held} files and may hold at most "
                              f"{MAX_FILES_PER_CONVERSATION}: start a new one")  # fmt: skip
        if request.origin == "upload" and any(len(file.content) > MAX_UPLOAD_BYTES for file in request.files):
            return FilesSaved(error=f"a file a person sends is at most {MAX_UPLOAD_BYTES:,} bytes")
        for file in request.files:
            stored = await files.save(owner=owner, name=file.name, content=file.content, origin=request.origin,
                                      run_id=request.run_id or "", retention_days=request.retention_days)  # fmt: skip
            saved.append(SavedFile(id=stored.id, name=stored.name, media_type=stored.media_type, size=stored.size))
    except StoreUnavailable as exc:
        log.warning("cannot keep files of %s/%s: %s", namespace, agent, exc)
        return FilesSaved(files=saved, error="the run store is unavailable; the files were not kept")
    return FilesSaved(files=saved)


async def list_files(files: FileStore, *, namespace: str, agent: str, request: ListFiles) -> FilesListed:
    """The files of one of the agent's conversations (the agent as validated), oldest first."""
    owner = FileOwner(namespace=namespace, agent=agent, caller=request.caller, session_id=request.session_id)
    try:
        listed = await files.conversation(owner=owner)
    except StoreUnavailable as exc:
        log.warning("cannot list files of %s/%s: %s", namespace, agent, exc)
        return FilesListed(error="the run store is unavailable; the conversation's files cannot be listed now")
    return FilesListed(files=[SavedFile(id=f.id, name=f.name, media_type=f.media_type, size=f.size) for f in listed])
