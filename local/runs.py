"""`rockbot local` records its agents' runs in a SQLite run store directly: the same recorder as in a cluster,
publishing into the console's store instead of onto the bus, and reading sessions' histories and working memory
from it; long-term memories are kept there too, asked of the same store the console asks."""

from __future__ import annotations

from rockbot.agent.long_term_memory import MemoryUnavailable
from rockbot.agent.recording import Publish
from rockbot.console.file_store import FileStore
from rockbot.console.files import list_files, save_files
from rockbot.console.memory_store import MemoryStore
from rockbot.console.store import Batch, Store, StoreUnavailable
from rockbot.contracts.files import FilesListed, FilesSaved, ListFiles, SaveFiles
from rockbot.contracts.memories import MemoryReply, MemoryRequest
from rockbot.contracts.recording import HistoryReply, RunEvents


def store_publisher(store: Store, *, namespace: str, agent: str) -> Publish:
    """Write an agent's run events into `store` as that agent (locally every agent is trusted: one person's)."""

    async def publish(events: RunEvents) -> None:
        await store.write(batches=[Batch(namespace=namespace, agent=agent, events=events.events)])

    return publish


class StoreHistory:
    """A session's recorded history, read from the local store (the same answer the console gives an agent)."""

    def __init__(self, store: Store, *, namespace: str, agent: str) -> None:
        self._store = store
        self._namespace = namespace
        self._agent = agent

    async def fetch(self, *, caller: str, session_id: str, max_messages: int) -> HistoryReply | None:
        return await self._store.session_history(namespace=self._namespace, agent=self._agent, caller=caller,
                                                 session_id=session_id, max_messages=max_messages)  # fmt: skip

    async def memory(self, *, caller: str, session_id: str, key: str) -> HistoryReply | None:
        return await self._store.session_memory(namespace=self._namespace, agent=self._agent, caller=caller,
                                                session_id=session_id, key=key)  # fmt: skip


class StoreMemoryDesk:
    """An agent's long-term memory requests, answered from the local store as the console answers them."""

    def __init__(self, memories: MemoryStore, *, namespace: str, agent: str) -> None:
        self._memories = memories
        self._namespace = namespace
        self._agent = agent

    async def ask(self, request: MemoryRequest) -> MemoryReply:
        try:
            return await self._memories.answer(namespace=self._namespace, agent=self._agent, request=request)
        except StoreUnavailable as exc:
            raise MemoryUnavailable(str(exc)) from None


class StoreFileKeeper:
    """An agent's script artifacts, kept in the local store as the console keeps them."""

    def __init__(self, files: FileStore, *, namespace: str, agent: str) -> None:
        self._files = files
        self._namespace = namespace
        self._agent = agent

    async def save(self, request: SaveFiles) -> FilesSaved:
        return await save_files(self._files, namespace=self._namespace, agent=self._agent, request=request)

    async def list(self, request: ListFiles) -> FilesListed:
        return await list_files(self._files, namespace=self._namespace, agent=self._agent, request=request)


class _NoFiles:
    async def save(self, request: SaveFiles) -> FilesSaved:
        return FilesSaved(error="rockbot local keeps files only in its run store, and runs without one here")

    async def list(self, request: ListFiles) -> FilesListed:
        return FilesListed()


#: The keeper of a `rockbot local` that records no runs.
NO_FILES = _NoFiles()
