"""The conversation files a script request names (`InputFiles`), fetched for its `/input` by the trusted side.

The agent passes references only; the scripts-manager reads the bytes from the console (`ConsoleInputs`: `ReadFile`
on `console.file-reads`, a `FileChunk` at a time, on a reply queue of its own and believed only from
`service.console`), naming the agent as the broker validated the request's sender (`rockbot local` answers them
the same way from its SQLite store). A file the conversation does not hold (an id of another conversation among
them) fails the call with the same words as a missing one; a console that cannot answer fails it as retryable.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Protocol, TypeVar

from pydantic import BaseModel

from rockbot.bus import Bus, BusError
from rockbot.bus.identity import CONSOLE, Principal
from rockbot.bus.topology import CONSOLE_FILE_READS, service_replies
from rockbot.contracts.files import NOT_FOUND, FileChunk, ReadFile
from rockbot.contracts.scripts import InputFiles
from rockbot.scripts_manager.backends import InputFile

Answer = TypeVar("Answer", bound=BaseModel)

#: The most one call's input files may hold together (each was bounded when it was kept).
MAX_INPUT_BYTES = 64 * 1024 * 1024
#: How long the console has for one chunk.
READ_TIMEOUT_SECONDS = 15.0


class InputsUnavailable(Exception):
    """The named files cannot be given to the script: the message says which and why (for the model)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class InputSource(Protocol):
    async def fetch(self, files: InputFiles, *, agent: Principal) -> tuple[InputFile, ...]:
        """The files' names and bytes, in the order named; `InputsUnavailable` when one cannot be read."""


class ManagerConsole:
    """The console, asked over the bus by this scripts-manager process, on a reply queue of its own and believed
    only from `service.console`."""

    def __init__(self, bus: Bus, *, timeout_seconds: float) -> None:
        self._bus = bus
        self._replies = service_replies(service="scripts-manager", instance=uuid.uuid4().hex[:12])
        self._timeout = timeout_seconds

    async def ask(self, *, queue: str, body: BaseModel, answer: type[Answer], kind: str) -> Answer:
        """The console's answer to `body` on `queue`; a `BusError` (a timeout among them) when none comes."""
        reply = await self._bus.request(
            queue=queue, body=body, reply_queue=self._replies, correlation_id=f"{kind}-{secrets.token_hex(8)}",
            timeout_seconds=self._timeout, responder=CONSOLE,
        )  # fmt: skip
        return reply.decode(answer)


class ConsoleInputs(ManagerConsole):
    """The console's file reads."""

    def __init__(self, bus: Bus, *, timeout_seconds: float = READ_TIMEOUT_SECONDS) -> None:
        super().__init__(bus, timeout_seconds=timeout_seconds)

    async def fetch(self, files: InputFiles, *, agent: Principal) -> tuple[InputFile, ...]:
        fetched, total = [], 0
        for file_id in files.ids:
            content, name = bytearray(), ""
            while True:
                chunk = await self._chunk(ReadFile(namespace=agent.namespace, agent=agent.name, caller=files.caller,
                                                   session_id=files.session_id, file_id=file_id,
                                                   offset=len(content)))  # fmt: skip
                if chunk.error:
                    raise InputsUnavailable(f"input_files: {file_id}: {chunk.error}",
                                            retryable=chunk.error != NOT_FOUND)
                name = chunk.name
                content += chunk.content
                total += len(chunk.content)
                if total > MAX_INPUT_BYTES:
                    raise InputsUnavailable(f"input_files: together over {MAX_INPUT_BYTES:,} bytes: name fewer")
                if len(content) >= chunk.size or not chunk.content:
                    break
            fetched.append(InputFile(name=name, content=bytes(content)))
        return _unique(fetched)

    async def _chunk(self, request: ReadFile) -> FileChunk:
        try:
            return await self.ask(queue=CONSOLE_FILE_READS, body=request, answer=FileChunk, kind="read")
        except BusError as exc:
            raise InputsUnavailable(f"the console (which keeps the conversation's files) did not answer: {exc}",
                                    retryable=True) from exc


def _unique(files: list[InputFile]) -> tuple[InputFile, ...]:
    """Two files of one name (a person sent `data.csv` twice): the later one is `/input/data.csv`, as a person
    who sends a newer version means."""
    by_name = {file.name: file for file in files}
    return tuple(by_name.values())
