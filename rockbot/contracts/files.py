"""A conversation's files between the console and those who keep or read them over the bus.

On `console.files`, an agent asks the console to keep files (`SaveFiles`) or to list its conversation's
(`ListFiles`); on `console.file-reads`, the scripts-manager reads the files a script request names
(`InputFiles` in `rockbot.contracts.scripts`) one chunk at a time (`ReadFile`, answered with a `FileChunk`), and on
`console.file-writes` it keeps a call's artifacts that do not travel in its answer (`WriteFile`, a chunk at a time,
answered with `FileWritten`).

A script's small artifacts reach the agent in its `ScriptInvokeResponse`; the agent, which holds no database
credentials, sends them here with the run they came with (larger ones the scripts-manager kept already: the answer
names them by id). Which agent sends is never a field: the console takes
it from the broker-validated sender, keeps files only for that agent's own runs (`owns_run`) and under the
conversation (agent, `caller`, `session_id`) the run belongs to. The reply names each kept file by its id, which
is 128 random bits (the console's `file_store`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rockbot.contracts.recording import Id, Label
from rockbot.contracts.scripts import AGENT_NAME_PATTERN, ConversationPart, FileId, FileName

SCHEMA_VERSION = 1
#: The largest `SaveFiles` the console reads (one bus message).
MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: The most of a file one `FileChunk` carries: a larger file is read in several.
CHUNK_BYTES = 4 * 1024 * 1024
#: The largest `ReadFile` the console reads (it holds no content).
MAX_READ_BYTES = 4096
#: The largest `WriteFile` the console reads: a chunk, base64, and its names.
MAX_WRITE_REQUEST_BYTES = CHUNK_BYTES * 4 // 3 + 16 * 1024
#: The largest file the scripts-manager may keep (a script's file is bounded lower, 10 MiB by default).
MAX_WRITTEN_BYTES = 64 * 1024 * 1024
#: What the console answers for a file that is not the conversation's, whether or not it exists elsewhere.
NOT_FOUND = "no such file in this conversation"
#: Bounds on what people (console, A2A) attach: bytes a file, files a turn, files a conversation keeps.
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MAX_ATTACHED_PER_TURN = 10
MAX_FILES_PER_CONVERSATION = 100
#: The largest file one `SaveFiles` carries from an agent (an A2A client's, a saved tool result): one bus message
#: (8 MiB) holds it, base64 and all.
MAX_SENT_FILE_BYTES = 5 * 1024 * 1024


class FileContent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    name: FileName
    content: bytes


class SaveFiles(BaseModel):
    """Keep files under a conversation: a run's script artifacts (`script`) or a tool's result the model saved
    (`tool`), each with the run, which must be the sender's; or what a person sent with a turn (`upload`: an A2A
    client's `FilePart`s, before the turn's run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["save"] = "save"
    schema_version: Literal[1] = SCHEMA_VERSION
    origin: Literal["script", "tool", "upload"] = "script"
    run_id: Id | None = None
    caller: Annotated[str, Field(min_length=1, max_length=256)]
    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    files: Annotated[list[FileContent], Field(min_length=1, max_length=100)]
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30

    @model_validator(mode="after")
    def _scripts_name_their_run(self) -> SaveFiles:
        if self.origin != "upload" and self.run_id is None:
            raise ValueError(f"run_id: a {self.origin}'s files are kept with the run they came with")
        return self


class ListFiles(BaseModel):
    """An agent asks which files its conversation (the validated agent, `caller`, `session_id`) holds, oldest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["list"] = "list"
    schema_version: Literal[1] = SCHEMA_VERSION
    caller: ConversationPart
    session_id: ConversationPart


class SavedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Label
    name: FileName
    media_type: Label
    size: int


class FilesSaved(BaseModel):
    """The files kept, in the order sent; `error` says why none were (another agent's run, the store down)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    files: list[SavedFile] = Field(default_factory=list)
    error: Annotated[str, Field(max_length=1000)] = ""


class FilesListed(BaseModel):
    """A conversation's files (no content), oldest first; `error` when the store could not be read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    files: list[SavedFile] = Field(default_factory=list)
    error: Annotated[str, Field(max_length=1000)] = ""


class ReadFile(BaseModel):
    """The scripts-manager reads `CHUNK_BYTES` of one file from `offset`, on `console.file-reads`.

    `namespace` and `agent` are the broker-validated sender of the script request that named the file (the
    scripts-manager is trusted to pass them on; the console takes `ReadFile` from `service.scripts-manager`
    only, answered on one of its own reply queues); `caller` and `session_id` are the conversation that request
    named. A file of any other conversation is answered `NOT_FOUND`, exactly as an id nobody holds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["read"] = "read"
    schema_version: Literal[1] = SCHEMA_VERSION
    namespace: Annotated[str, Field(pattern=AGENT_NAME_PATTERN, max_length=63)]
    agent: Annotated[str, Field(pattern=AGENT_NAME_PATTERN, max_length=63)]
    caller: ConversationPart
    session_id: ConversationPart
    file_id: FileId
    offset: Annotated[int, Field(ge=0)] = 0


class FileChunk(BaseModel):
    """Part of a file: `content` is its bytes from `offset` (at most `CHUNK_BYTES`); the file has `size` in all.
    `error` (and nothing else) when it cannot be read: `NOT_FOUND`, or the store down."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    schema_version: Literal[1] = SCHEMA_VERSION
    id: Label = ""
    name: Annotated[str, Field(max_length=255)] = ""
    media_type: Label = ""
    size: Annotated[int, Field(ge=0)] = 0
    offset: Annotated[int, Field(ge=0)] = 0
    content: bytes = b""
    error: Annotated[str, Field(max_length=1000)] = ""


class WriteFile(BaseModel):
    """The scripts-manager keeps part of one of a call's artifacts, on `console.file-writes`: `content` is the file's
    bytes from `offset` (at most `CHUNK_BYTES`), of `size` in all.

    `namespace` and `agent` are the broker-validated sender of the script request (the scripts-manager is trusted to
    pass them on; the console takes `WriteFile` from `service.scripts-manager` only); `run_id`, `caller` and
    `session_id` are the conversation the request named (`OutputFiles`), and the run must be that agent's. The first
    chunk has no `file_id`: the console answers the id it will keep the file under, and every later chunk names it
    and the same conversation, name and size. The file is visible (listed, read, served) only once its last chunk is
    stored; the chunks of one never completed are deleted by the console's sweep (`PART_SECONDS`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    kind: Literal["write"] = "write"
    schema_version: Literal[1] = SCHEMA_VERSION
    namespace: Annotated[str, Field(pattern=AGENT_NAME_PATTERN, max_length=63)]
    agent: Annotated[str, Field(pattern=AGENT_NAME_PATTERN, max_length=63)]
    run_id: Id
    caller: ConversationPart
    session_id: ConversationPart
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30
    name: FileName
    size: Annotated[int, Field(ge=0, le=MAX_WRITTEN_BYTES)]
    offset: Annotated[int, Field(ge=0)] = 0
    file_id: FileId | None = None
    content: Annotated[bytes, Field(max_length=CHUNK_BYTES)] = b""

    @model_validator(mode="after")
    def _within_the_file(self) -> WriteFile:
        if self.offset + len(self.content) > self.size:
            raise ValueError("content: the chunk ends past the file's size")
        if (self.offset == 0) != (self.file_id is None):
            raise ValueError("file_id: the first chunk (offset 0) has none, every later one names the file")
        return self


class FileWritten(BaseModel):
    """The file's id and how much of it is stored; `complete` once it is whole (and visible). `error` (and nothing
    else) when the chunk was not stored: another agent's run, a chunk out of order, the store down."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    id: Label = ""
    stored: Annotated[int, Field(ge=0)] = 0
    complete: bool = False
    error: Annotated[str, Field(max_length=1000)] = ""


def attachment_note(files: list[SavedFile]) -> str:
    """What the model reads of a turn's attachments, after the person's message: each file's name, type and size,
    and where a script finds it."""
    if not files:
        return ""
    listed = "; ".join(f"{file.name} ({file.media_type}, {file.size:,} bytes)" for file in files)
    return f"\n\n[attached, read-only for scripts under /input: {listed}]"
