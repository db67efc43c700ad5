"""Messages of `execute_python_script` between an agent and the scripts-manager.

The request travels on `script.invoke`; the answer (a `ScriptInvokeResponse` or a
`ScriptInvokeError`, told apart by `kind`) goes to the asking process's reply queue
(`agent.<namespace>.<agent>.replies.<n>`) with the request id as correlation id. A
script that overruns its timeout or memory is still a
*response* (`timed_out` / `oom_killed`, with the output it produced); an error means the script
could not be run or answered at all.

Structure is checked here; limits that depend on the deployment (size caps, timeout bounds,
allowed packages, CPU and memory maximums) are checked by the scripts-manager and answered with
an error naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter

from rockbot.contracts.errors import ErrorInfo
from rockbot.contracts.recording import Id

SCHEMA_VERSION = 1

#: What an agent name may look like: it names the asking agent (`agent.<namespace>.<agent>...`).
AGENT_NAME_PATTERN = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"
#: A positive Kubernetes quantity without exponent (`250m`, `0.5`, `128Mi`, `1G`), as an Agent's scriptLimits give it.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32)]
#: Where a script finds its conversation's files (read-only) and leaves the files it gives back (see README).
INPUT_DIR = "/input"
OUTPUT_DIR = "/output"
#: The most of the conversation's files one call sees under `/input` (the newest, when it has more).
MAX_INPUT_FILES = 20
#: A stored file's id: 128 random bits (the console's `file_store`), so ids of other conversations cannot be guessed.
FILE_ID_PATTERN = r"^f[0-9a-f]{32}$"
FileId = Annotated[str, Field(pattern=FILE_ID_PATTERN)]
#: A conversation's caller or session id, as the run's record names them.
ConversationPart = Annotated[str, Field(min_length=1, max_length=256)]


def _checked_name(name: str) -> str:
    if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError("a file name is a relative path without empty, '.' or '..' parts (such as 'charts/a.png')")
    if not all(ch.isprintable() for ch in name):
        raise ValueError("a file name holds printable characters only")
    return name


#: A file's name under `/input` or `/output`: a relative path of printable characters, never `..`; a label, never a
#: path on any host.
FileName = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_checked_name)]


class ScriptArtifact(BaseModel):
    """A file the script left under `/output`: its name there, its sniffed type, its size and its first lines."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    name: FileName
    #: Sniffed from the content for raster images (a `.png` holding HTML is `application/octet-stream`).
    media_type: Annotated[str, Field(max_length=128)]
    size: Annotated[int, Field(ge=0)]
    #: The first lines of a text or CSV file, for the model; empty for anything else.
    preview: Annotated[str, Field(max_length=2000)] = ""
    #: The bytes, when they travel in the answer; empty when the scripts-manager kept the file itself (`id`).
    content: bytes = b""
    #: The file's id in the run store when the scripts-manager kept it under the request's `output_files` (files
    #: too large for one answer); None when its bytes travel here and the agent keeps them.
    id: FileId | None = None


class InputFiles(BaseModel):
    """The conversation's stored files a script sees under `/input`: references, never bytes.

    The agent, which holds no database credentials, names the files of the conversation its call belongs to
    (`caller` as validated when the turn came in, and `session_id`) by id. The scripts-manager fetches their bytes
    from the console (`ReadFile` on `console.file-reads`, `rockbot.contracts.files`) naming the request's
    broker-validated sender as the agent, never a field of this request; the console reads a file only when it
    belongs to exactly that conversation (agent, caller, session), and answers one that does not as it answers an
    id nobody holds. So an agent can reach only its own conversations' files, and a script only those its call
    named; the names under `/input` are the stored ones (`FileName`: never a host path).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    caller: ConversationPart
    session_id: ConversationPart
    ids: Annotated[tuple[FileId, ...], Field(min_length=1, max_length=MAX_INPUT_FILES)]


class OutputFiles(BaseModel):
    """Where a call's artifacts are kept when they do not travel in its answer: the run the call belongs to and its
    conversation (`caller` as validated when the turn came in, `session_id`), kept for `retention_days`.

    The scripts-manager then keeps them itself in the console (`WriteFile` on `console.file-writes`, 4 MiB a
    chunk) as the request's broker-validated sender, never an agent a field names; the console keeps them only
    when `run_id` is that agent's. Without it a call's files are bounded by what one answer carries (about
    3.5 MiB).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: Id
    caller: ConversationPart
    session_id: ConversationPart
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


class ScriptInvokeRequest(BaseModel):
    """Run `script` with `input_data` on its standard input; `request_id` is the tool-call id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: Annotated[str, Field(min_length=1, max_length=256)]
    agent: Annotated[str, Field(pattern=AGENT_NAME_PATTERN)]
    script: Annotated[str, Field(min_length=1)]
    input_data: str | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 30.0
    pip_packages: tuple[str, ...] = ()
    #: The sandbox's CPU and memory (requests = limits). The scripts-manager runs a script with the limits of
    #: its sender's Agent (`spec.scriptLimits`, looked up by `user_id`); these, like `timeout_seconds`, may only
    #: lower them, never raise them (None: the Agent's).
    cpu: Quantity | None = None
    memory: Quantity | None = None
    #: The conversation this call belongs to, as an opaque digest of (agent, validated caller, session) the agent
    #: makes: when the sender's Agent has `spec.scriptSessions.mode: PerConversation`, calls with the same
    #: sender and session share one sandbox (the manager keys it by the broker-validated sender too, so
    #: another agent naming it reaches a session of its own); otherwise it is ignored.
    session: Annotated[str, Field(pattern=r"^[0-9a-f]{16,64}$")] | None = None
    #: The conversation's files to put read-only under `/input` (None: an empty `/input`).
    input_files: InputFiles | None = None
    #: Where the scripts-manager keeps artifacts too large for the answer (None: only what one answer carries).
    output_files: OutputFiles | None = None


class ScriptInvokeResponse(BaseModel):
    """What the script did: its two output streams kept apart, and how it ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["result"] = "result"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    stdout: str
    stderr: str
    exit_code: int | None  # None when the script was killed before it could exit
    timed_out: bool = False
    oom_killed: bool = False
    output_truncated: bool = False
    duration_seconds: float
    #: Where it ran, for the run's record: `pods` (a script pod, named in `pod`) or `local/<isolation>`
    #: (`local/bwrap`, `local/unshare`, `local/unsafe-none`); empty from a manager that does not say.
    backend: Annotated[str, Field(max_length=64)] = ""
    pod: Annotated[str, Field(max_length=253)] = ""
    #: What the script left under `/output` within the bounds, and a sentence per file (or group) left out.
    artifacts: tuple[ScriptArtifact, ...] = ()
    artifacts_dropped: tuple[str, ...] = ()
    #: A session's call: `new` (its first call, or one after the session ended idle or old), `kept` (the session's
    #: interpreter and files from earlier calls), `restarted` (the session before this one crashed, ran out of
    #: memory or time: its variables and files are gone) or `ended` (this call ended the session: the next call
    #: starts afresh). Empty for a per-call script.
    session: Literal["", "new", "kept", "restarted", "ended"] = ""


class ScriptInvokeError(BaseModel):
    """The script could not be run (bad request, policy, sandbox or cluster down, no answer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["error"] = "error"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    error: ErrorInfo


ScriptInvokeReply = Annotated[ScriptInvokeResponse | ScriptInvokeError, Field(discriminator="kind")]

#: Parses a reply body into whichever of the two it is.
SCRIPT_INVOKE_REPLY: TypeAdapter[ScriptInvokeResponse | ScriptInvokeError] = TypeAdapter(ScriptInvokeReply)
