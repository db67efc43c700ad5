"""A conversation's files in the run store's database: saved under the conversation, read only by it.

    files = FileStore(store=store)
    saved = await files.save(owner=owner, run_id=run_id, name="clean.csv", content=data, origin="script")
    listed = await files.conversation(owner=owner)
    found = await files.read(file_id, owner=owner)       # the agent's and scripts-manager's path: its conversation
    found = await files.read_any(file_id)                # the console's path: it then asks RBAC about the namespace
    part = await files.write_part(Part(owner=..., run_id=..., name=..., size=..., file_id=..., offset=...), chunk)

`owner` is the conversation (agent and caller as the broker or the console validated them, and the session);
a file id is 128 random bits. A read that does not match answers None, the same as an id that does not exist,
so an id of another conversation tells nothing. The media type is sniffed again here (`outputs.sniff`): only a
real PNG, JPEG, GIF or WebP is ever typed as an image, whatever a sender claimed. Files go with the retention
of their run (`Store.delete_expired`, the console's sweep).

A file the scripts-manager writes in chunks (`write_part`) is kept in `file_parts` until its last chunk, which moves
it into `conversation_files` in the same transaction: until then no list or read sees it. The parts of a file not
completed within `PART_SECONDS` (its writer died) are deleted by the sweep (`delete_stale_parts`).
"""

from __future__ import annotations

import datetime
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import delete, func, select, update

from rockbot.console.store import Store
from rockbot.console.store_models import Origin, StoredFile
from rockbot.console.store_schema import conversation_files, file_parts, runs
from rockbot.media import sniff


class FileOwner(BaseModel):
    """The conversation a file belongs to."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    agent: str
    caller: str
    session_id: str


#: How long a file's chunks wait for the rest: a scripts-manager writes a call's files one chunk after another, each
#: answered within seconds, so parts this old belong to a writer that died; the sweep deletes them.
PART_SECONDS = 3600


class Part(BaseModel):
    """Where a chunk of a file being written goes: the file (`file_id`; None for its first chunk), its conversation
    and run, its name and whole size, and the chunk's offset."""

    model_config = ConfigDict(frozen=True)

    owner: FileOwner
    run_id: str
    name: str
    size: int
    offset: int
    file_id: str | None
    retention_days: int = 30


class PartStored(BaseModel):
    """A chunk stored: the file's id, how many of its bytes are stored, and whether it is whole (and visible).
    `problem` instead when the chunk does not continue the file it names."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    stored: int = 0
    complete: bool = False
    problem: str = ""


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

    async def write_part(self, part: Part, content: bytes, *, now: datetime.datetime | None = None) -> PartStored:
        """Store one chunk of a file; the chunk that completes it makes the file (its type sniffed from the whole).

        Chunks come in order, each continuing the same file of the same conversation, run, name and size; one
        that does not is refused (`problem`). A chunk stored before (a redelivered request) is answered as stored.
        """
        now = now or datetime.datetime.now(datetime.UTC)
        file_id = part.file_id or new_file_id()
        end = part.offset + len(content)
        async with self._store._connection() as connection, connection.begin():
            if part.file_id is not None:
                done = (await connection.execute(select(conversation_files.c.size).where(
                    conversation_files.c.id == file_id, *_owned(part.owner)))).scalar()  # fmt: skip
                if done is not None:  # completed by this chunk before: its answer was lost
                    return PartStored(id=file_id, stored=done, complete=True)
                held = (await connection.execute(select(
                    func.coalesce(func.sum(func.length(file_parts.c.content)), 0), func.count(),
                    func.min(file_parts.c.created_at),
                ).where(file_parts.c.file_id == file_id, *_part_of(part)))).one()  # fmt: skip
                stored, count, began = int(held[0]), int(held[1]), held[2]
                if not count:
                    return PartStored(problem=f"no file {file_id} is being written for this conversation, run and "
                                              "name (its first chunk was never stored, or it expired)")
                if end <= stored:  # stored before: its answer was lost
                    return PartStored(id=file_id, stored=stored)
                if part.offset != stored:
                    return PartStored(problem=f"the chunk starts at byte {part.offset:,}, but {stored:,} bytes of "
                                              "the file are stored: chunks come in order")
            else:
                began = now
            if end < part.size:
                await connection.execute(file_parts.insert().values(
                    file_id=file_id, start_byte=part.offset, **part.owner.model_dump(), run_id=part.run_id,
                    name=part.name, size=part.size, content=content, created_at=began))  # fmt: skip
                return PartStored(id=file_id, stored=end)
            earlier = (await connection.execute(select(file_parts.c.content).where(
                file_parts.c.file_id == file_id).order_by(file_parts.c.start_byte))).scalars().all()  # fmt: skip
            whole = b"".join([*map(bytes, earlier), content])
            row = {
                "id": file_id, **part.owner.model_dump(), "run_id": part.run_id, "origin": "script",
                "name": part.name, "media_type": sniff(part.name, whole), "size": len(whole), "created_at": now,
                "expires_at": now + datetime.timedelta(days=part.retention_days),
            }  # fmt: skip
            StoredFile.model_validate(row)
            await connection.execute(conversation_files.insert().values(**row, content=whole))
            await connection.execute(delete(file_parts).where(file_parts.c.file_id == file_id))
        return PartStored(id=file_id, stored=len(whole), complete=True)

    async def delete_stale_parts(self, *, now: datetime.datetime) -> int:
        """Delete the chunks of files begun more than `PART_SECONDS` ago and never completed; how many."""
        cutoff = now - datetime.timedelta(seconds=PART_SECONDS)
        async with self._store._connection() as connection, connection.begin():
            result = await connection.execute(delete(file_parts).where(file_parts.c.created_at < cutoff))
        return int(result.rowcount or 0)

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


def _part_of(part: Part) -> list[Any]:
    """The stored chunks of the same file: the same conversation, run, name and size."""
    owner = part.owner
    return [file_parts.c.namespace == owner.namespace, file_parts.c.agent == owner.agent,
            file_parts.c.caller == owner.caller, file_parts.c.session_id == owner.session_id,
            file_parts.c.run_id == part.run_id, file_parts.c.name == part.name, file_parts.c.size == part.size]


def _owned(owner: FileOwner) -> list[Any]:
    return [conversation_files.c.namespace == owner.namespace, conversation_files.c.agent == owner.agent,
            conversation_files.c.caller == owner.caller, conversation_files.c.session_id == owner.session_id]
