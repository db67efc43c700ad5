"""A conversation's files in the run store's database: saved under the conversation, read only by it.

    files = FileStore(store=store)
    saved = await files.save(owner=owner, run_id=run_id, name="clean.csv", content=data, origin="script")
    listed = await files.conversation(owner=owner)
    found = await files.read(file_id, owner=owner)       # the agent's and scripts-manager's path: its conversation
    found = await files.read_any(file_id)                # the console's path: it then asks RBAC about the namespace

`owner` is the conversation (agent and caller as the broker or the console validated them, and the session);
a file id is 128 random bits. A read that does not match answers None, the same as an id that does not exist,
so an id of another conversation tells nothing. The media type is sniffed again here (`outputs.sniff`): only a
real PNG, JPEG, GIF or WebP is ever typed as an image, whatever a sender claimed. Files go with the retention
of their run (`Store.delete_expired`, the console's sweep).
"""

from __future__ import annotations

import datetime
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import func, select, update

from rockbot.console.store import Store
from rockbot.console.store_models import Origin, StoredFile
from rockbot.console.store_schema import conversation_files, runs
from rockbot.media import sniff


class FileOwner(BaseModel):
    """The conversation a file belongs to."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    agent: str
    caller: str
    session_id: str


_LISTED = [column for column in conversation_files.c if column.name != "content"]


def new_file_id() -> str:
    return "f" + secrets.token_hex(16)


class FileStore:
    def __init__(self, *, store: Store) -> None:
        self._store = store

    async def save(
        self, *, owner: FileOwner, name: str, content: bytes, origin: Origin, run_id: str = "",
        retention_days: int = 30, now: datetime.datetime | None = None,
    ) -> StoredFile:  # fmt: skip
        """Keep `content` under the conversation; its type is sniffed here, never taken from the sender."""
        now = now or datetime.datetime.now(datetime.UTC)
        row = {
            "id": new_file_id(), **owner.model_dump(), "run_id": run_id, "origin": origin, "name": name,
            "media_type": sniff(name, content), "size": len(content), "created_at": now,
            "expires_at": now + datetime.timedelta(days=retention_days),
        }  # fmt: skip
        stored = StoredFile.model_validate(row)  # the name is checked before anything is written
        async with self._store._connection() as connection, connection.begin():
            await connection.execute(conversation_files.insert().values(**row, content=content))
        return stored

    async def conversation(self, *, owner: FileOwner) -> list[StoredFile]:
        """The conversation's files, oldest first."""
        query = select(*_LISTED).where(*_owned(owner)).order_by(conversation_files.c.created_at,
                                                                 conversation_files.c.id)  # fmt: skip
        return [StoredFile.model_validate(dict(row)) for row in await self._rows(query)]

    async def of_run(self, run_id: str) -> list[StoredFile]:
        """The files a run brought (a person's attachments, its scripts' artifacts), oldest first."""
        query = select(*_LISTED).where(conversation_files.c.run_id == run_id).order_by(
            conversation_files.c.created_at, conversation_files.c.id)  # fmt: skip
        return [StoredFile.model_validate(dict(row)) for row in await self._rows(query)]

    async def attach(self, file_ids: list[str], *, owner: FileOwner, run_id: str) -> None:
        """Name `run_id` as the run that brought the conversation's files `file_ids` (a person's attachments, kept
        before their turn had a run), and keep them for the run's retention (the Agent's `spec.runs.retentionDays`)
        when the run is recorded already; files of another conversation or run are left as they are."""
        if not file_ids:
            return
        expiry = select(runs.c.expires_at).where(runs.c.run_id == run_id).scalar_subquery()
        query = update(conversation_files).where(conversation_files.c.id.in_(file_ids), *_owned(owner),
                                                 conversation_files.c.run_id == "").values(
            run_id=run_id, expires_at=func.coalesce(expiry, conversation_files.c.expires_at))  # fmt: skip
        async with self._store._connection() as connection, connection.begin():
            await connection.execute(query)

    async def read(self, file_id: str, *, owner: FileOwner) -> tuple[StoredFile, bytes] | None:
        """The file and its content if it is the conversation's; None otherwise, as for an id nobody holds."""
        return await self._one(select(conversation_files).where(conversation_files.c.id == file_id, *_owned(owner)))

    async def read_any(self, file_id: str) -> tuple[StoredFile, bytes] | None:
        """The file whoever owns it: for the console, which then asks the cluster whether the person may read it."""
        return await self._one(select(conversation_files).where(conversation_files.c.id == file_id))

    async def _one(self, query: Any) -> tuple[StoredFile, bytes] | None:
        rows = await self._rows(query)
        if not rows:
            return None
        row = dict(rows[0])
        return StoredFile.model_validate(row), bytes(row["content"])

    async def _rows(self, query: Any) -> Any:
        async def read(connection: Any) -> Any:
            return (await connection.execute(query)).mappings().all()

        return await self._store._read(read)


def _owned(owner: FileOwner) -> list[Any]:
    return [conversation_files.c.namespace == owner.namespace, conversation_files.c.agent == owner.agent,
            conversation_files.c.caller == owner.caller, conversation_files.c.session_id == owner.session_id]
