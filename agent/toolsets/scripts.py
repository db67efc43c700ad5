"""The `scripts` set (`execute_python_script`) and script-backed Tools: Python run in the sandbox.

The agent never runs code itself: it asks the scripts-manager over the bus (through the sandbox
client, `rockbot.agent.sandbox`) and gets the script's stdout, stderr and exit code back, or an
error as data. A script-backed Tool resource runs its fixed source with the call's arguments as
JSON on stdin. The tool's own timeout is the script's limit plus `SANDBOX_MARGIN_SECONDS`, since
a throw-away pod must be scheduled and started before the script's clock even starts.
The client (`ScriptSandbox`) is passed to the runtime as `sandbox=`; anything with the same
`execute_python_script` method will do (a local runner for `rockbot local`, for instance).
"""

# No `from __future__ import annotations` here: the tool's annotations use this agent's limits,
# local values that must be evaluated when the function is defined.
import json
import secrets
from collections import OrderedDict
from typing import Annotated, Any, Protocol

from pydantic import Field

from rockbot.agent.defining import tool
from rockbot.agent.file_keeping import FileKeeper, keep_tool_result
from rockbot.agent.memory import MAX_CHUNKS
from rockbot.agent.recording import current_run
from rockbot.agent.registry import Tool, ToolContext, ToolFailure, ToolRegistry
from rockbot.agent.sandbox import LONGEST_EXTRA_SECONDS, session_digest
from rockbot.agent.toolsets.kit import Guide, ToolKit, catalogue_description
from rockbot.contracts.agent_config import ResolvedTool, ScriptBackend
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.files import MAX_SENT_FILE_BYTES
from rockbot.contracts.scripts import INPUT_DIR, OUTPUT_DIR, FileName, ScriptInvokeError, ScriptInvokeResponse

#: The client waits at most the script's limit plus its acceptance and start-up bounds; the tool waits a little
#: longer, so the client's clearer error (not taken, no answer) is the one the model sees.
SANDBOX_MARGIN_SECONDS = LONGEST_EXTRA_SECONDS + 10.0

GUIDE = Guide(
    name="python-scripts",
    summary="Running Python in the network-less sandbox.",
    document=(
        "# Python scripts\n\n"
        "`execute_python_script(script, input_data?, timeout_seconds?, pip_packages?)` runs Python 3 in a "
        "throw-away sandbox with no network. Read `input_data` with `json.load(sys.stdin)`, print results "
        "(JSON is easiest to use afterwards) and exit 0. You get stdout, stderr and the exit code; a "
        "non-zero exit code means the script failed: read stderr, fix the script and try again.\n\n"
        f"The conversation's files are in `{INPUT_DIR}` (read-only). Files the script writes under `{OUTPUT_DIR}` "
        "(charts, cleaned data) are given to the user, and you get their names, types, sizes and first lines; "
        "`plt.show()` saves each open matplotlib figure there as a PNG.\n\n"
        "A tool result too long for your context is kept in working memory as chunks (an index of keys); "
        f"`save_result_as_file(key, name)` saves that whole result as a file of the conversation, so a script "
        f"can read it as `{INPUT_DIR}/<name>` instead of you copying it into the script.\n"
    ),
)


class Sandbox(Protocol):
    """The agent-side client of the scripts-manager (see `rockbot.agent.sandbox`)."""

    #: Where the conversation's files are kept (None: nowhere).
    keeper: FileKeeper | None

    async def execute_python_script(
        self,
        *,
        request_id: str,
        script: str,
        input_data: str | None,
        timeout_seconds: float,
        pip_packages: list[str],
        session: str | None,
    ) -> ScriptInvokeResponse | ScriptInvokeError: ...


class SessionsSeen:
    """The conversations whose script session answered this agent before (the most recent 4,096).

    A scripts-manager that never held a conversation's session says `new` for it; the session it had may have
    been at another one, one that died or another replica (see docs/concepts/script-sessions.md). Such a `new`
    is told as `restarted`: the model must not take the earlier variables for kept.
    """

    def __init__(self, most: int = 4096) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._most = most

    def said(self, session: str, said: str) -> str:
        known = session in self._seen
        self._seen[session] = None
        self._seen.move_to_end(session)
        while len(self._seen) > self._most:
            self._seen.popitem(last=False)
        return "restarted" if said == "new" and known else said


async def run_script(
    kit: ToolKit,
    *,
    request_id: str,
    script: str,
    input_data: Any,
    timeout_seconds: float,
    pip_packages: tuple[str, ...],
    conversation: str | None = None,
    sessions: SessionsSeen | None = None,
) -> str:
    """Run one script; `conversation` (the call's conversation key) picks the conversation's own sandbox when
    the Agent's `scriptSessions.mode` is PerConversation (`sessions`: those this agent had answers from)."""
    if kit.sandbox is None:
        raise ToolFailure(
            "this agent cannot run scripts: it has no sandbox, since no scripts-manager is in reach (it has no bus, or "
            "only an in-memory one of its own); answer without running code",
            code=ErrorCode.UNAVAILABLE,
        )
    session = session_digest(conversation) if conversation and _per_conversation(kit) else None
    reply = await kit.sandbox.execute_python_script(
        request_id=f"{request_id or 'call'}.{secrets.token_hex(4)}",  # unique even if a model reuses call ids
        script=script,
        input_data=None if input_data is None else json.dumps(input_data),
        timeout_seconds=timeout_seconds,
        pip_packages=list(pip_packages),
        session=session,
    )
    if isinstance(reply, ScriptInvokeError):
        raise ToolFailure(reply.error.message, code=reply.error.code, retryable=reply.error.retryable)
    if session is not None and sessions is not None and reply.session:
        reply = reply.model_copy(update={"session": sessions.said(session, reply.session)})
    return format_response(reply)



def _per_conversation(kit: ToolKit) -> bool:
    return kit.config.script_limits.sessions.mode == "PerConversation"


#: What the model is told about its session, when it has one.
SESSION_NOTES = {
    "new": "a new session: variables and files you make stay for this conversation's next scripts",
    "kept": "same session: variables, imports and files of earlier scripts are still there",
    "restarted": "the session was restarted; earlier variables are gone (and its files): recreate what you need",
    "ended": "this script ended the session; its variables are gone: the next script starts afresh",
}


def format_response(reply: ScriptInvokeResponse) -> str:
    ended = f"exit code {reply.exit_code}" if reply.exit_code is not None else "killed before it exited"
    notes = [
        note
        for flag, note in (
            (reply.timed_out, "the script ran out of time"),
            (reply.oom_killed, "the script ran out of memory"),
            (reply.output_truncated, "output was truncated"),
        )
        if flag
    ]
    if reply.session:
        notes.append(SESSION_NOTES[reply.session])
    header = f"{ended} after {reply.duration_seconds:.2f} s" + (f" ({'; '.join(notes)})" if notes else "")
    return f"{header}\n--- stdout ---\n{reply.stdout}\n--- stderr ---\n{reply.stderr}" + describe_artifacts(reply)


def describe_artifacts(reply: ScriptInvokeResponse) -> str:
    """What the model learns of the files a script wrote under /output: name, type, size, a text's first lines."""
    if not reply.artifacts and not reply.artifacts_dropped:
        return ""
    lines = [f"\n--- files written to {OUTPUT_DIR} (shown to the user) ---"]
    for artifact in reply.artifacts:
        lines.append(f"- {artifact.name} ({artifact.media_type}, {artifact.size:,} bytes)")
        lines += [f"    {line}" for line in artifact.preview.splitlines()]
    lines += [f"- left out: {dropped}" for dropped in reply.artifacts_dropped]
    return "\n".join(lines)


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    limits = kit.config.script_limits
    sessions = SessionsSeen()

    @tool(
        name="execute_python_script",
        description=catalogue_description("execute_python_script"),
        timeout=limits.timeout_seconds + SANDBOX_MARGIN_SECONDS,
    )
    async def execute_python_script(
        script: Annotated[str, Field(min_length=1, description="Python 3 source code.")],
        context: ToolContext,
        input_data: Annotated[Any, Field(description="Any JSON value; the script reads it from stdin.")] = None,
        timeout_seconds: Annotated[
            float, Field(gt=0, le=limits.timeout_seconds, description="Time limit for the script in seconds.")
        ] = limits.timeout_seconds,
        pip_packages: Annotated[list[str], Field(description="Packages to make available, e.g. ['numpy'].")] = [],  # noqa: B006
    ) -> str:
        return await run_script(
            kit,
            request_id=context.tool_call_id,
            script=script,
            input_data=input_data,
            timeout_seconds=timeout_seconds,
            pip_packages=tuple(pip_packages),
            conversation=context.session_id,
            sessions=sessions,
        )

    registry.register(execute_python_script)
    registry.register(result_saver(kit))
    kit.guides.add(GUIDE)


def result_saver(kit: ToolKit) -> Tool:
    """`save_result_as_file`: a chunked tool result, whole, as a file of the conversation (for `/input`)."""

    @tool(name="save_result_as_file", description=catalogue_description("save_result_as_file"))
    async def save_result_as_file(
        key: Annotated[str, Field(pattern=r"^[0-9a-f]{6}-[0-9]+$",
                                  description="Any key of the result's working-memory index, e.g. `ab12cd-0`.")],
        name: Annotated[FileName, Field(description="The file's name under /input, e.g. `orders.json`.")],
        context: ToolContext,
    ) -> str:
        result = key.rsplit("-", 1)[0]
        chunks = []
        for n in range(MAX_CHUNKS):
            chunk = await kit.memory.read(session_id=context.session_id, key=f"{result}-{n}")
            if chunk is None:
                break
            chunks.append(chunk)
        if not chunks:
            raise ToolFailure(
                f"key: no working-memory result {result!r} (it expired or never existed): call the tool again and "
                "save the key of its new index", code=ErrorCode.INVALID_ARGUMENTS,
            )  # fmt: skip
        text = "".join(chunks)
        if (size := len(text.encode())) > MAX_SENT_FILE_BYTES:
            raise ToolFailure(f"the result is {size:,} bytes, more than the {MAX_SENT_FILE_BYTES:,} a saved result "
                              "may be: ask the tool for less", code=ErrorCode.INVALID_ARGUMENTS)  # fmt: skip
        keeper = getattr(kit.sandbox, "keeper", None)
        saved = await keep_tool_result(text, name=name, run=current_run(), keeper=keeper)
        if saved.error or not saved.files:
            raise ToolFailure(f"the result was not saved as a file: {saved.error}", code=ErrorCode.UNAVAILABLE)
        kept = saved.files[0]
        return (f"saved {len(chunks)} chunk(s), {kept.size:,} bytes, as {kept.name} ({kept.media_type}): "
                f"scripts of this conversation read it as {INPUT_DIR}/{kept.name}")  # fmt: skip

    return save_result_as_file


def script_tool(resolved: ResolvedTool, *, kit: ToolKit):
    """A Tool resource with a `script` backend: its source runs with the arguments on stdin."""
    backend = resolved.backend
    assert isinstance(backend, ScriptBackend)
    script_timeout = min(resolved.timeout_seconds, kit.config.script_limits.timeout_seconds)

    async def execute(args: dict[str, Any], context: ToolContext) -> str:
        return await run_script(
            kit,
            request_id=context.tool_call_id,
            script=backend.source,
            input_data=args,
            timeout_seconds=script_timeout,
            pip_packages=tuple(backend.pip_packages),
        )

    return execute, script_timeout + SANDBOX_MARGIN_SECONDS
