"""Where a conversation's files are kept and listed: the console over the bus (`console.files`), or `rockbot local`'s
store.

The agent holds no database credentials: it sends the files of a run it records in `Full` to the console with the
run's conversation (caller, session), and the console keeps them under it (`console/files.py`). What could not be
kept is said in the tool result beside the files' descriptions, never dropped silently. A script call names the
conversation's files for `/input` by id (`input_files`), as listed here: the scripts-manager fetches their bytes.
It also names where the call's files are kept (`output_files`: the run and its conversation): files too large for
the script's answer are then kept by the scripts-manager itself, and the answer names them by id.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

from rockbot.agent.console_requests import ask_console
from rockbot.agent.recording import Run
from rockbot.bus import BusError
from rockbot.bus.topology import CONSOLE_FILES
from rockbot.contracts.files import FileContent, FilesListed, FilesSaved, ListFiles, SaveFiles
from rockbot.contracts.scripts import (
    MAX_INPUT_FILES,
    InputFiles,
    OutputFiles,
    ScriptArtifact,
    ScriptInvokeResponse,
)

#: How long the console has to keep a call's files (at most one bus message of them).
KEEP_TIMEOUT_SECONDS = 15.0


class FileKeeper(Protocol):
    async def save(self, request: SaveFiles) -> FilesSaved: ...

    async def list(self, request: ListFiles) -> FilesListed: ...


class BusFileKeeper:
    """The console, asked on `console.files` and answering on this process's own reply queue."""

    def __init__(self, *, bus: Any, timeout_seconds: float = KEEP_TIMEOUT_SECONDS) -> None:
        self._bus = bus
        self._timeout = timeout_seconds

    async def save(self, request: SaveFiles) -> FilesSaved:
        try:
            return await ask_console(self._bus, queue=CONSOLE_FILES, body=request, answer=FilesSaved, kind="files",
                                     timeout_seconds=self._timeout)  # fmt: skip
        except BusError as exc:
            return FilesSaved(error=f"the console (which keeps files) did not answer: {exc}")

    async def list(self, request: ListFiles) -> FilesListed:
        try:
            return await ask_console(self._bus, queue=CONSOLE_FILES, body=request, answer=FilesListed, kind="files",
                                     timeout_seconds=self._timeout)  # fmt: skip
        except BusError as exc:
            return FilesListed(error=f"the console (which keeps files) did not answer: {exc}")


@dataclasses.dataclass(frozen=True)
class Made:
    """A file a script of the turn gave back, and its id in the run store ("" when it was not kept)."""

    artifact: ScriptArtifact
    file_id: str = ""


_made: contextvars.ContextVar[list[Made] | None] = contextvars.ContextVar("rockbot_made", default=None)


@contextlib.contextmanager
def collecting_artifacts() -> Iterator[list[Made]]:
    """The files the scripts of a turn run inside the block give back (for an A2A answer's artifacts, the
    OpenAI-compatible answer's links)."""
    made: list[Made] = []
    token = _made.set(made)
    try:
        yield made
    finally:
        _made.reset(token)


def _collect(artifacts: tuple[ScriptArtifact, ...], ids: list[str]) -> None:
    made = _made.get()
    if made is not None:
        made.extend(Made(artifact=a, file_id=ids[n] if n < len(ids) else "") for n, a in enumerate(artifacts))


async def input_files(run: Run | None, *, keeper: FileKeeper | None) -> InputFiles | None:
    """The conversation's files a script sees under `/input` (the newest `MAX_INPUT_FILES`), by reference; None
    when it has none, or they cannot be listed (the script then sees an empty `/input`). Files are kept only with
    runs recorded in `Full` (a run store that also keeps the conversation), so only those list them."""
    if keeper is None or run is None or run.recorder.record != "Full":
        return None
    caller, session_id = run.caller or "-", run.session_id or "-"
    listed = await keeper.list(ListFiles(caller=caller, session_id=session_id))
    if not listed.files:
        return None
    ids = tuple(file.id for file in listed.files[-MAX_INPUT_FILES:])
    return InputFiles(caller=caller, session_id=session_id, ids=ids)


def not_kept_because(run: Run | None, *, keeper: FileKeeper | None) -> str | None:
    """Why no file of `run` can be kept for its conversation, or None when they can (runs recorded in `Full`)."""
    if keeper is None:
        return "this agent has no run store to keep files in"
    if run is None or run.recorder.record != "Full":
        return "this Agent does not record its runs in Full (spec.recording), so files are not kept"
    return None


async def keep_tool_result(text: str, *, name: str, run: Run | None, keeper: FileKeeper | None) -> FilesSaved:
    """Keep a tool's result as a file of the run's conversation (origin `tool`), for scripts to read under /input."""
    why = not_kept_because(run, keeper=keeper)
    if why is not None:
        return FilesSaved(error=why)
    assert run is not None and keeper is not None
    return await keeper.save(SaveFiles(
        origin="tool", run_id=run.run_id, caller=run.caller or "-", session_id=run.session_id or "-",
        retention_days=run.recorder.retention_days, files=[FileContent(name=name, content=text.encode())],
    ))  # fmt: skip


def output_files(run: Run | None, *, keeper: FileKeeper | None) -> OutputFiles | None:
    """Where the scripts-manager keeps a call's files too large for its answer: the run and its conversation, when
    the run is recorded in `Full` (None otherwise: the call's files are then only what its answer carries)."""
    if not_kept_because(run, keeper=keeper) is not None:
        return None
    assert run is not None
    return OutputFiles(run_id=run.run_id, caller=run.caller or "-", session_id=run.session_id or "-",
                       retention_days=run.recorder.retention_days)  # fmt: skip


async def keep_artifacts(answer: ScriptInvokeResponse, *, run: Run | None, keeper: FileKeeper | None
                         ) -> ScriptInvokeResponse:  # fmt: skip
    """`answer` once its artifacts are kept with the run (those the scripts-manager kept already, named by id, are
    not sent again); what was not kept joins `artifacts_dropped`. Whoever collects the turn's files
    (`collecting_artifacts`) gets them with their ids."""
    carried = [artifact for artifact in answer.artifacts if not artifact.id]  # the others the manager kept
    why = not_kept_because(run, keeper=keeper) if carried else None
    saved: list[str] = []
    if carried and why is None:
        assert run is not None and keeper is not None
        request = SaveFiles(
            run_id=run.run_id, caller=run.caller or "-", session_id=run.session_id or "-",
            retention_days=run.recorder.retention_days,
            files=[FileContent(name=artifact.name, content=artifact.content) for artifact in carried],
        )  # fmt: skip
        reply = await keeper.save(request)
        saved, why = [file.id for file in reply.files], reply.error or None
    ids = iter(saved)
    _collect(answer.artifacts, [artifact.id or next(ids, "") for artifact in answer.artifacts])
    if why is None:
        return answer
    note = f"the files were shown to the model but not kept for people: {why}"
    return answer.model_copy(update={"artifacts_dropped": (*answer.artifacts_dropped, note)})
