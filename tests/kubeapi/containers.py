"""What the node's container runtime holds of a running container: its stdin, its log, who is attached.

The fake kubelet (kubelet.py) starts the process and feeds its output here; the emulator serves
`pods/log` from `log` and `pods/attach` sessions from `attach()`. As with a real runtime, an attached
client sees only output written while it is attached (the log keeps everything), and with
`stdinOnce` the container's stdin closes when the first attach session ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Chunk = tuple[int, bytes]  # (1 stdout | 2 stderr, data)


class Container:
    """One container's streams, from start to exit."""

    def __init__(
        self,
        *,
        write_stdin: Callable[[bytes], Awaitable[None]] | None = None,
        close_stdin: Callable[[], None] | None = None,
        stdin_once: bool = False,
    ) -> None:
        self.log = bytearray()
        self.running = True
        self._write_stdin = write_stdin
        self._close_stdin = close_stdin
        self._stdin_once = stdin_once
        self._sessions: set[asyncio.Queue[Chunk | None]] = set()
        self.attached = 0

    # ---- the kubelet's side

    def output(self, channel: int, data: bytes) -> None:
        """The process wrote `data`: it goes to the log and to every attached client."""
        self.log += data
        for session in self._sessions:
            session.put_nowait((channel, data))

    def exited(self) -> None:
        """The process ended: attached sessions end after the output they were sent."""
        self.running = False
        self.close_stdin()
        for session in self._sessions:
            session.put_nowait(None)
        self._sessions.clear()

    # ---- the API server's side (an attach session)

    def attach(self) -> asyncio.Queue[Chunk | None]:
        """A queue of the output written from now on; None when the container exits."""
        queue: asyncio.Queue[Chunk | None] = asyncio.Queue()
        self.attached += 1
        if self.running:
            self._sessions.add(queue)
        else:
            queue.put_nowait(None)
        return queue

    def detach(self, queue: asyncio.Queue[Chunk | None]) -> None:
        self._sessions.discard(queue)
        if self._stdin_once:
            self.close_stdin()

    async def write_stdin(self, data: bytes) -> None:
        if self._write_stdin is not None and self.running:
            await self._write_stdin(data)

    def close_stdin(self) -> None:
        if self._close_stdin is not None:
            close, self._close_stdin, self._write_stdin = self._close_stdin, None, None
            close()
