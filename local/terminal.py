"""Lines typed at the terminal, read on the event loop, so Ctrl-C at the prompt ends the chat at once.

`input()` in a thread cannot be interrupted: the event loop waits for the thread at exit (until Enter),
and a daemon thread blocked in it holds stdin's lock, which aborts the interpreter as it exits. Here
the loop watches the descriptor and reads only what is there; the terminal's own line editing
(backspace, Ctrl-U) still works. A regular file as stdin is read directly: it never blocks.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from typing import TextIO


class Terminal:
    def __init__(self, *, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._pending = b""
        self._ended = False

    async def line(self, prompt: str) -> str | None:
        """The next line without its newline, after showing `prompt`; None once the input ends."""
        self._stdout.write(prompt)
        self._stdout.flush()
        descriptor = self._stdin.fileno()
        if stat.S_ISREG(os.fstat(descriptor).st_mode):
            text = self._stdin.readline()
            return text.rstrip("\n") if text else None
        while b"\n" not in self._pending and not self._ended:
            data = await _readable(descriptor)
            self._pending += data
            self._ended = not data
        if not self._pending:
            return None
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode(errors="replace").rstrip("\r")


async def _readable(descriptor: int) -> bytes:
    """What the descriptor holds once it is readable (b"" at its end), without making it non-blocking: a terminal's
    descriptors share that flag, and stdout must stay blocking."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(descriptor, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(descriptor)
    return os.read(descriptor, 65536)
