"""Files an agent asks the console to keep for a conversation, on `console.files`, and the console's reply.

A script's artifacts reach the agent in its `ScriptInvokeResponse`; the agent, which holds no database
credentials, sends them here with the run they came with. Which agent sends is never a field: the console takes
it from the broker-validated sender, keeps files only for that agent's own runs (`owns_run`) and under the
conversation (agent, `caller`, `session_id`) the run belongs to. The reply names each kept file by its id, which
is 128 random bits (the console's `file_store`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from rockbot.contracts.recording import Id, Label
from rockbot.contracts.scripts import FileName

SCHEMA_VERSION = 1
#: The largest `SaveFiles` the console reads (one bus message).
MAX_REQUEST_BYTES = 8 * 1024 * 1024


class FileContent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    name: FileName
    content: bytes


class SaveFiles(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["save"] = "save"
    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: Id
    caller: Annotated[str, Field(min_length=1, max_length=256)]
    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    files: Annotated[list[FileContent], Field(min_length=1, max_length=100)]
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


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
