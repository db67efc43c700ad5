"""Long-term memory requests an agent sends to the console on `console.memory`, and the console's reply.

An agent never holds database credentials: it embeds a text with its own embeddings endpoint and asks
the console to keep it (`Remember`; since the agent answers the model before it embeds, usually without the
embedding, given afterwards by `Embed`, and `Pending` lists what it left unembedded), to find the nearest of what
it kept (`Recall`) or to delete one (`Forget`). Which agent asks is never a field: the console takes it from the
broker-validated sender, so no agent reads or writes another's memories. Within the agent, whose memory it is
comes from the conversation's caller (the broker-validated sender of the turn, `console:<user>` for a person in
the console), which the agent names in `caller`; `shared` (the Agent's `scope: Agent`) puts every caller's
memories in one. The agent's policy (`retention_days`, the per-scope bounds) travels with each
`Remember`, and the console holds it to its own ceilings, so a hostile agent gains nothing by lying.
"""

from __future__ import annotations

import datetime
import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rockbot.contracts.errors import ErrorInfo

SCHEMA_VERSION = 1
#: The longest text one memory keeps; a longer one is refused with this bound named (the model shortens it).
MAX_MEMORY_CHARS = 2000
#: The most numbers in one embedding (pgvector's `vector` holds up to 16,000; no embeddings model gives more).
MAX_DIMENSIONS = 4096
#: The most memories one recall returns.
MAX_RECALL = 20
#: The largest request the console reads: an embedding of `MAX_DIMENSIONS` numbers as JSON, and the text.
MAX_REQUEST_BYTES = 160 * 1024
#: A memory's id: `m-` and 16 hex digits, chosen by the agent so a redelivered `Remember` is kept once.
MEMORY_ID = r"^m-[0-9a-f]{16}$"

MemoryScope = Literal["Caller", "Agent"]
MemoryId = Annotated[str, Field(pattern=MEMORY_ID)]
Tag = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,40}$")]
#: Who told the agent (or whose memory it is): a bus principal, `http`, or `console:<user>`.
Caller = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^|]+$")]
ModelName = Annotated[str, Field(min_length=1, max_length=256)]


def _finite(vector: list[float]) -> list[float]:
    # A finite sum means finite numbers (a NaN or an infinity makes the sum one); the sum is C's loop, each number's
    # check Python's: this runs on every embedding the console reads.
    if not math.isfinite(sum(vector)) and not all(map(math.isfinite, vector)):
        raise ValueError("an embedding holds finite numbers only (no NaN or infinity)")
    if not any(vector):
        raise ValueError("an embedding of zeros has no direction: nothing is near it")
    return vector


Embedding = Annotated[list[float], Field(min_length=1, max_length=MAX_DIMENSIONS), AfterValidator(_finite)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    #: The conversation's caller: the scope's owner when not `shared`, and who told the agent.
    caller: Caller
    #: The Agent's `scope: Agent`: one memory every caller of the agent shares.
    shared: bool = False


class Remember(_Request):
    """Keep a text within the scope's bounds. Without `embedding` it is kept pending (found by words, not yet by
    meaning) until an `Embed` gives it one: the agent answers the model once the text is kept, and embeds after."""

    kind: Literal["remember"] = "remember"
    memory_id: MemoryId
    text: Annotated[str, Field(min_length=1, max_length=MAX_MEMORY_CHARS)]
    tags: Annotated[list[Tag], Field(max_length=8)] = Field(default_factory=list)
    embedding: Embedding | None = None
    #: The embeddings model that made (or is to make) `embedding`: a recall compares only vectors of the same model.
    model: ModelName
    retention_days: Annotated[int, Field(ge=1, le=3650)]
    max_items: Annotated[int, Field(ge=1)]
    max_bytes: Annotated[int, Field(ge=1)]
    #: The run that remembered it (shown beside the memory, so a person can see where it came from).
    run_id: Annotated[str, Field(max_length=64)] = ""
    #: The agent told the model it is kept once the broker held this request (written behind): the console keeps it
    #: when it can (a store that is busy or down puts it back on its queue), and a refusal is only said in its reply.
    answered: bool = False
    #: Answer with the scope's room (`MemoryReply.room`); an agent that does not ask reads no such field.
    room: bool = False


class Recall(_Request):
    kind: Literal["recall"] = "recall"
    embedding: Embedding
    model: ModelName
    k: Annotated[int, Field(ge=1, le=MAX_RECALL)] = 5


class Forget(_Request):
    kind: Literal["forget"] = "forget"
    memory_id: MemoryId


class Embed(BaseModel):
    """Give one of the agent's pending memories (kept by a `Remember` without an embedding) its embedding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["embed"] = "embed"
    memory_id: MemoryId
    embedding: Embedding
    model: ModelName


class Pending(BaseModel):
    """The agent's memories still waiting for their embedding (an agent that stopped before it embedded them), oldest
    first: `MemoryReply.memories`, whose `score` means nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["pending"] = "pending"
    limit: Annotated[int, Field(ge=1, le=MAX_RECALL)] = MAX_RECALL


class Usage(_Request):
    """What the scope may still take under these bounds and the console's (`MemoryReply.room`), asked as a turn
    starts so that the turn's `remember` is written behind."""

    kind: Literal["usage"] = "usage"
    max_items: Annotated[int, Field(ge=1)]
    max_bytes: Annotated[int, Field(ge=1)]


MemoryRequest = Annotated[Remember | Recall | Forget | Embed | Pending | Usage, Field(discriminator="kind")]


class RecalledMemory(BaseModel):
    """One memory as the agent gets it back: never who told it (in a shared scope that is another caller's
    business)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    text: str
    tags: list[str] = Field(default_factory=list)
    created_at: datetime.datetime
    #: Cosine similarity to the query, 1 the same direction, 0 unrelated.
    score: float


class Room(BaseModel):
    """What a scope may still take after a `Remember`: the least left under its own bounds and its agent's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    items: Annotated[int, Field(ge=0)]
    bytes: Annotated[int, Field(ge=0)]


class MemoryReply(BaseModel):
    """What became of a request: the memories recalled, the id kept, whether one was forgotten, or an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    memories: list[RecalledMemory] = Field(default_factory=list)
    stored: str | None = None
    forgotten: bool = False
    error: ErrorInfo | None = None
    #: After a kept `Remember`: what its scope may still take (the agent writes behind within it, see `Remember`).
    room: Room | None = None
