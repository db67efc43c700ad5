"""A call's artifacts kept in the console by the scripts-manager itself, when they are too large for its answer.

The answer is one bus message, which carries about 3.5 MiB of files (base64, beside both output streams at their
cap). When the request names where its files are kept (`output_files`: its run and conversation) and its files do
not fit there, the manager writes each to the console (`WriteFile` on `console.file-writes`, `CHUNK_BYTES` a
message, on a reply queue of its own and believed only from `service.console`), naming the agent as the broker
validated the request's sender, never a field of the request; the console keeps a file only for one of that agent's
runs and shows it only once whole. The answer then names each file by id with its description (name, type, size,
first lines) and without its bytes; a file the console did not keep is left out by name, with why.

Files that fit in the answer travel there as before and the agent keeps them (`console.files`): no console round
trip on the call's own path, which is what a chart or a small CSV costs least with (benchmarks/README.md); and an
A2A client gets their bytes in the answer, where a kept file comes as its console link.
"""

from __future__ import annotations

import asyncio

from rockbot.bus import Bus, BusError
from rockbot.bus.identity import Principal
from rockbot.bus.topology import CONSOLE_FILE_WRITES
from rockbot.contracts.files import CHUNK_BYTES, FileWritten, WriteFile
from rockbot.contracts.scripts import OutputFiles, ScriptArtifact, ScriptInvokeResponse
from rockbot.scripts_manager.input_files import ManagerConsole

#: How long the console has for one chunk.
WRITE_TIMEOUT_SECONDS = 15.0
#: How long the console has for all of a call's files (10 MiB took 0.3-0.4 s, benchmarks/README.md): the manager's
#: word to the agent adds it to the time it answers within, so a slow console drops files by name, not the call.
KEEP_SECONDS = 20.0


class NotKept(Exception):
    """The console did not keep a file: the message says why (for the model)."""


class ConsoleOutputs(ManagerConsole):
    """The console's file writes."""

    def __init__(self, bus: Bus, *, inline_bytes: int, timeout_seconds: float = WRITE_TIMEOUT_SECONDS,
                 keep_seconds: float = KEEP_SECONDS) -> None:  # fmt: skip
        super().__init__(bus, timeout_seconds=timeout_seconds)
        self._inline = inline_bytes
        self.keep_seconds = keep_seconds

    async def keep(self, answer: ScriptInvokeResponse, *, target: OutputFiles, agent: Principal
                   ) -> ScriptInvokeResponse:  # fmt: skip
        """`answer` with the files that do not fit in it kept in the console and named by id: in name order, a file
        travels in the answer while the answer's room for files (`inline_bytes`) holds it, and is kept otherwise."""
        if sum(artifact.size for artifact in answer.artifacts) <= self._inline:
            return answer
        kept, dropped, room = [], list(answer.artifacts_dropped), self._inline
        deadline = asyncio.get_running_loop().time() + self.keep_seconds
        for artifact in answer.artifacts:
            if artifact.size <= room:
                room -= artifact.size
                kept.append(artifact)
                continue
            try:
                async with asyncio.timeout_at(deadline):
                    file_id = await self._write(artifact, target=target, agent=agent)
            except TimeoutError:
                dropped.append(f"{artifact.name}: {artifact.size:,} bytes, not kept: the console took longer than "
                               f"{self.keep_seconds:g} s to keep the call's files")  # fmt: skip
                continue
            except NotKept as exc:
                dropped.append(f"{artifact.name}: {artifact.size:,} bytes, not kept: {exc}")
                continue
            kept.append(artifact.model_copy(update={"content": b"", "id": file_id}))
        return answer.model_copy(update={"artifacts": tuple(kept), "artifacts_dropped": tuple(dropped)})

    async def _write(self, artifact: ScriptArtifact, *, target: OutputFiles, agent: Principal) -> str:
        content, file_id, offset = artifact.content, None, 0
        while True:
            written = await self._chunk(WriteFile(
                namespace=agent.namespace, agent=agent.name, run_id=target.run_id, caller=target.caller,
                session_id=target.session_id, retention_days=target.retention_days, name=artifact.name,
                size=len(content), offset=offset, file_id=file_id, content=content[offset:offset + CHUNK_BYTES],
            ))  # fmt: skip
            if written.error:
                raise NotKept(written.error)
            if written.complete:
                return written.id
            if written.stored <= offset or written.stored >= len(content):
                raise NotKept(f"the console stored {written.stored:,} bytes of it after a chunk from {offset:,}")
            file_id, offset = written.id, written.stored

    async def _chunk(self, request: WriteFile) -> FileWritten:
        try:
            return await self.ask(queue=CONSOLE_FILE_WRITES, body=request, answer=FileWritten, kind="write")
        except BusError as exc:
            raise NotKept(f"the console (which keeps the conversation's files) did not answer: {exc}") from exc
