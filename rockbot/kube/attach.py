"""`pods/attach` over a WebSocket, in the channel protocol the API server speaks (`v5.channel.k8s.io`).

Each binary message starts with one byte naming its channel: 0 stdin (client to container), 1 stdout,
2 stderr, 3 the session's final `Status` (JSON), 4 terminal resizes. Version 5 adds a close signal:
the message `[255, channel]` half-closes a channel (the client's way to end stdin). The server opens
with an empty message on the lowest output channel it serves; when the container's output ends it
sends the `Status` (`Success`, or why the session failed, e.g. the container is not running) on
channel 3, then a close frame. Since Kubernetes 1.30 the API server itself terminates v5 sessions
(translating them to the kubelet's SPDY), so an error reaching the kubelet arrives as that Status
after the upgrade, not as an HTTP error. Older servers pass the WebSocket to the kubelet, which speaks
`v4.channel.k8s.io`: the same channels without the close signal; clients offer both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

PROTOCOL = "v5.channel.k8s.io"
#: What Kubernetes before 1.30 serves (the kubelet's own WebSocket server): the same channels, no close signal.
PROTOCOL_V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
CLOSE_SIGNAL = 255


@dataclass(frozen=True)
class Output:
    """A piece of the container's output: `channel` is STDOUT or STDERR."""

    channel: int
    data: bytes


class AttachSession:
    """An open attach session: `write()` to stdin, iterate for output, then read `status`."""

    def __init__(self, websocket: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = websocket
        self.protocol = websocket.protocol
        self.status: dict[str, Any] | None = None

    async def write(self, data: bytes) -> None:
        """Send bytes to the container's stdin."""
        await self._ws.send_bytes(bytes([STDIN]) + data)

    async def close_stdin(self) -> None:
        """End the container's stdin (with `stdinOnce`, the container sees end of file); v5 only."""
        if self.protocol != PROTOCOL:
            raise ValueError(f"{self.protocol} has no way to close stdin but closing the session")
        await self._ws.send_bytes(bytes([CLOSE_SIGNAL, STDIN]))

    async def __aiter__(self) -> AsyncIterator[Output]:
        """The container's output as it comes, until the server ends the session (`status` is then set)."""
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                continue
            channel, data = message.data[0], message.data[1:]
            if channel in (STDOUT, STDERR):
                if data:
                    yield Output(channel=channel, data=data)
            elif channel == ERROR and data:
                self.status = _status(data)

    @property
    def succeeded(self) -> bool:
        """Whether the server reported the session ended normally (the container's output ended)."""
        return (self.status or {}).get("status") == "Success"


def _status(data: bytes) -> dict[str, Any]:
    try:
        status = json.loads(data)
    except ValueError:
        status = None
    if not isinstance(status, dict):  # pre-v4 servers sent plain text
        status = {"status": "Failure", "message": data.decode(errors="replace")}
    return status
