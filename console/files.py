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

from rockbot.bus import Bus, Delivery, Refused, Subscription
from rockbot.bus.shares import InFlight
from rockbot.bus.topology import CONSOLE_FILES, agent_replies_prefix
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.files import MAX_REQUEST_BYTES, FilesSaved, SavedFile, SaveFiles
from rockbot.contracts.recording import owns_run

log = logging.getLogger(__name__)

#: File requests of one agent answered at once; its others are refused meanwhile.
FILES_PER_AGENT = 2


class FileAnswerer:
    """Answers `console.files`; `start()`, then `stop()`."""

    def __init__(self, *, files: FileStore, bus: Bus) -> None:
        self._files = files
        self._bus = bus
        self._in_flight = InFlight(per_sender=FILES_PER_AGENT)
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._subscription = await self._bus.consume(queue=CONSOLE_FILES, handler=self._on_request, prefetch=8)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close(drain_seconds=1.0)
            self._subscription = None

    async def _on_request(self, delivery: Delivery) -> None:
        agent = delivery.agent_answered_on_own(lambda p: agent_replies_prefix(namespace=p.namespace, name=p.name))
        if agent is None:
            raise Refused(
                f"a file request from {delivery.user_id!r} must come from an agent and be answered on one of its "
                f"own reply queues, not {delivery.reply_to!r}"
            )
        request = delivery.decode(SaveFiles, max_bytes=MAX_REQUEST_BYTES)
        with self._in_flight.slot(agent.user) as admitted:
            if not admitted:
                raise Refused(f"{agent} already has {FILES_PER_AGENT} file requests being answered")
            reply = await save_files(self._files, namespace=agent.namespace, agent=agent.name, request=request)
        await self._bus.reply(to=delivery, body=reply)



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
