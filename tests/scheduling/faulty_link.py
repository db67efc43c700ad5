"""A relay on 127.0.0.1 in front of the real API server that can break connections on demand.

A real API server (or a load balancer in front of it) drops connections, which the HTTP client
reports as `aiohttp.ClientError`s that are not `ApiError`s. Clients speak plain HTTP to the relay, so
it can read their request lines; it speaks TLS to the API server as the admin (`upstream_tls`). It
makes both kinds of drop happen for real, on loopback:

- `drop_requests(method=...)`: the matching request is never forwarded (nothing changed);
- `drop_responses(method=...)`: the request is forwarded and served, its answer is thrown away
  (the write happened but the client cannot know); with `then_go_down`, every connection is cut
  and new ones are refused until `heal()`, as when the network between them fails for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

CHUNK = 65536


@dataclass
class _Fault:
    method: bytes
    path_part: bytes
    lose_response: bool
    times: int
    then_go_down: bool = False


class FaultyLink:
    """Relays HTTP/1.1 connections to `target_port`; `url` is where clients connect instead."""

    def __init__(self, *, target_port: int, upstream_tls: ssl.SSLContext | None = None) -> None:
        self._target_port = target_port
        self._upstream_tls = upstream_tls
        self._faults: list[_Fault] = []
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self.dropped = 0
        self.down = False

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def drop_requests(self, *, method: str, path_part: str = "", times: int = 1) -> None:
        self._faults.append(_Fault(method.encode(), path_part.encode(), lose_response=False, times=times))

    def drop_responses(self, *, method: str, path_part: str = "", times: int = 1, then_go_down: bool = False) -> None:
        self._faults.append(
            _Fault(method.encode(), path_part.encode(), lose_response=True, times=times, then_go_down=then_go_down)
        )

    def heal(self) -> None:
        self._faults.clear()
        self.down = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FaultyLink]:
        self._server = await asyncio.start_server(self._relay, host="127.0.0.1", port=0)
        try:
            yield self
        finally:
            self._server.close()
            for pump in list(self._pumps):
                pump.cancel()
            await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        pump = asyncio.current_task()
        assert pump is not None
        self._pumps.add(pump)
        writers = [client_writer]
        losing: list[_Fault] = []
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._target_port,
                                                                             ssl=self._upstream_tls)
            writers.append(upstream_writer)
            await asyncio.gather(
                self._requests(client_reader, upstream_writer, losing),
                self._responses(upstream_reader, client_writer, losing),
            )
        except (ConnectionError, _Cut, asyncio.CancelledError):
            pass  # cancelled: the link went down, or it stops (asyncio's server would log a cancelled relay)
        finally:
            for writer in writers:
                writer.close()  # a clean close: the client sees the server hang up, not a reset
            self._pumps.discard(pump)

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, losing: list[_Fault]
    ) -> None:
        while chunk := await reader.read(CHUNK):
            fault = self._match(chunk)
            if self.down or (fault is not None and not fault.lose_response):
                self.dropped += 1
                raise _Cut
            if fault is not None:
                losing.append(fault)
            writer.write(chunk)
            await writer.drain()
        raise _Cut

    async def _responses(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, losing: list[_Fault]
    ) -> None:
        while chunk := await reader.read(CHUNK):
            if self.down:
                raise _Cut
            if losing:
                self.dropped += 1
                if losing[0].then_go_down:
                    self.down = True
                    for pump in self._pumps - {asyncio.current_task()}:
                        pump.cancel()
                raise _Cut
            writer.write(chunk)
            await writer.drain()
        raise _Cut

    def _match(self, chunk: bytes) -> _Fault | None:
        """The fault this chunk triggers: a request line (`METHOD /path HTTP/1.1`) that matches one."""
        line = chunk.split(b"\r\n", 1)[0].split(b" ")
        if len(line) != 3 or not line[2].startswith(b"HTTP/"):
            return None
        for fault in self._faults:
            if fault.times and line[0] == fault.method and fault.path_part in line[1]:
                fault.times -= 1
                return fault
        return None


class _Cut(Exception):
    """Ends both directions of one relayed connection."""
