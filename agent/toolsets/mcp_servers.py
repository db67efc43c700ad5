"""MCP-backed Tools through the official `mcp` SDK: streamable HTTP, SSE and stdio servers.

Each server named by the config's MCP tools gets one long-lived connection. The SDK's transports
are anyio context managers that must be entered and left by the same task, so each connection
lives in its own task and tool calls borrow its session. At start the server's tools are listed:
a tool whose backend names `tool: "*"` brings every tool of the server (under its own name, or
`<server>_<name>` if taken), a named one is registered under the Tool's name with the server's
input schema. Everything registered from a server has source `mcp:<server>`.

A server that is down at start does not stop the agent: its named tools are registered from the
config and answer `Unavailable` (retryable) until a call finds the server back; a connection
that breaks is reopened on the next call. Three management tools let the model look around:
`mcp_list_servers`, `mcp_get_tool_schema(server, tool)` and `mcp_invoke_tool(server, tool, arguments)`.

The management tools reach no further than the Agent's Tool resources do: a server tool is
reachable only if a Tool names it (or names `tool: "*"` on that server), and not if the agent's
blacklist names it, by its server name or by a local name it is (or would be) registered under.
Otherwise `mcp_invoke_tool` would be a back door around both the declared tools and the blacklist.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import Annotated, Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import Field

from rockbot.agent.defining import tool
from rockbot.agent.registry import (
    InvalidToolDefinition,
    ToolAlreadyExists,
    ToolContext,
    ToolFailure,
    ToolRegistry,
)
from rockbot.agent.toolsets.kit import Guide, ToolKit
from rockbot.contracts.agent_config import McpBackend, ResolvedTool
from rockbot.contracts.errors import ErrorCode

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 15.0

GUIDE = Guide(
    name="mcp-tools",
    summary="Finding and calling tools on the connected MCP servers.",
    document=(
        "# MCP tools\n\n"
        "1. `mcp_list_servers()` lists the connected MCP servers and their tools.\n"
        "2. `mcp_get_tool_schema(server, tool)` shows what arguments a tool takes.\n"
        "3. `mcp_invoke_tool(server, tool, arguments)` calls it with a JSON object of arguments.\n"
        "Tools that are registered directly (source `mcp:<server>`) can also be called by name.\n"
    ),
)


class McpConnection:
    """One server, one session, held open by a dedicated task and reopened when it breaks."""

    def __init__(self, *, name: str, backend: McpBackend):
        self.name = name
        self.backend = backend
        self.tools: dict[str, Any] = {}  # name -> mcp Tool (name, description, inputSchema)
        self.declared: dict[str, set[str]] = {}  # server tool -> local names the Tool resources give it
        self.declares_all = False  # a Tool names `tool: "*"` on this server
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()

    def _transport(self):
        backend = self.backend
        if backend.transport == "stdio":
            if not backend.command:
                raise ValueError(f"MCP server {self.name!r}: the stdio transport needs a command")
            return stdio_client(StdioServerParameters(command=backend.command[0], args=list(backend.command[1:])))
        if not backend.url:
            raise ValueError(f"MCP server {self.name!r}: the {backend.transport} transport needs a url")
        if backend.transport == "sse":
            return sse_client(backend.url)
        return streamable_http_client(backend.url)

    async def session(self) -> ClientSession:
        """The open session, connecting first if needed; `ToolFailure(Unavailable)` if the server is down."""
        async with self._lock:
            if self._session is not None and self._holder is not None and not self._holder.done():
                return self._session
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._closing = asyncio.Event()
            self._holder = asyncio.create_task(self._hold(ready), name=f"mcp:{self.name}")
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    self._session = await ready
            except Exception as exc:
                await self.close()
                where = self.backend.url or shlex.join(self.backend.command)
                raise ToolFailure(
                    f"MCP server {self.name!r} ({self.backend.transport} {where}) is unavailable: "
                    f"{type(exc).__name__}: {exc}",
                    code=ErrorCode.UNAVAILABLE,
                    retryable=True,
                ) from exc
            try:
                listing = await self._session.list_tools()
            except Exception as exc:
                await self.close()
                raise ToolFailure(
                    f"MCP server {self.name!r} is connected but cannot list its tools: {type(exc).__name__}: {exc}",
                    code=ErrorCode.UNAVAILABLE,
                    retryable=True,
                ) from exc
            self.tools = {t.name: t for t in listing.tools}
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("MCP server %r connection ended: %s", self.name, exc)
        finally:
            self._session = None

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> str:
        session = await self.session()
        if tool_name not in self.tools:
            raise ToolFailure(
                f"MCP server {self.name!r} has no tool {tool_name!r}; it has: {', '.join(self.tools) or 'none'}",
                code=ErrorCode.TOOL_NOT_FOUND,
            )
        try:
            result = await session.call_tool(tool_name, arguments)
        except Exception as exc:
            await self.close()  # a broken connection is reopened by the next call
            raise ToolFailure(
                f"MCP call {self.name}/{tool_name} failed: {type(exc).__name__}: {exc}",
                code=ErrorCode.UNAVAILABLE,
                retryable=True,
            ) from exc
        text = _result_text(result)
        if result.is_error:
            raise ToolFailure(f"MCP tool {self.name}/{tool_name} reported an error: {text}")
        return text

    def local_names(self, tool_name: str) -> set[str]:
        """The local names a server tool has (or would have) for this agent; empty if no Tool declares it."""
        names = set(self.declared.get(tool_name, ()))
        if self.declares_all:
            names |= {tool_name, f"{self.name}_{tool_name}"}
        return names

    def refusal(self, tool_name: str, *, registry: ToolRegistry) -> ToolFailure | None:
        """Why the management tools may not reach `tool_name` on this server, or None if they may."""
        names = self.local_names(tool_name)
        if not names:
            return ToolFailure(
                f"tool {tool_name!r} on MCP server {self.name!r} is not one of this agent's tools; "
                f"reachable here: {', '.join(self.reachable(registry=registry)) or 'none'}",
                code=ErrorCode.TOOL_NOT_FOUND,
            )
        blocked = self._blacklisted(tool_name, registry=registry)
        if blocked:
            return ToolFailure(
                f"tool {tool_name!r} on MCP server {self.name!r} is disabled for this agent (blacklisted as "
                f"{', '.join(map(repr, blocked))}); do not call it again",
                code=ErrorCode.BLACKLISTED,
            )
        return None

    def reachable(self, *, registry: ToolRegistry) -> list[str]:
        """The server's tools the management tools may reach."""
        return [t for t in self.tools if self.local_names(t) and not self._blacklisted(t, registry=registry)]

    def _blacklisted(self, tool_name: str, *, registry: ToolRegistry) -> list[str]:
        return sorted(n for n in self.local_names(tool_name) | {tool_name} if registry.is_blacklisted(n))

    async def close(self) -> None:
        self._closing.set()
        holder, self._holder = self._holder, None
        if holder is not None:
            try:
                async with asyncio.timeout(5):
                    await asyncio.shield(holder)
            except (TimeoutError, Exception):
                holder.cancel()
                with contextlib.suppress(BaseException):
                    await holder
        self._session = None


def _result_text(result: Any) -> str:
    parts = []
    for block in result.content:
        if getattr(block, "type", None) == "text":
            parts.append(block.text)
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


async def install_mcp_tools(*, registry: ToolRegistry, kit: ToolKit, tools: Iterable[ResolvedTool]) -> None:
    by_server: dict[str, list[ResolvedTool]] = {}
    for resolved in tools:
        assert isinstance(resolved.backend, McpBackend)
        by_server.setdefault(resolved.backend.server, []).append(resolved)
    if not by_server:
        return
    connections = {
        server: McpConnection(name=server, backend=entries[0].backend)  # type: ignore[arg-type]
        for server, entries in by_server.items()
    }
    for server, entries in by_server.items():
        connection = connections[server]
        kit.closers.append(connection.close)
        for resolved in entries:
            backend = resolved.backend
            assert isinstance(backend, McpBackend)
            if backend.tool == "*":
                connection.declares_all = True
            else:
                connection.declared.setdefault(backend.tool, set()).add(resolved.name)
    _register_management(registry, connections)  # first, so a server tool of the same name is the one renamed
    await asyncio.gather(*(_register_server(registry, connections[s], by_server[s]) for s in by_server))
    kit.guides.add(GUIDE)


async def _register_server(registry: ToolRegistry, connection: McpConnection, entries: list[ResolvedTool]) -> None:
    source = f"mcp:{connection.name}"
    try:
        await connection.session()
    except ToolFailure as failure:
        log.warning("%s; its tools answer Unavailable until it is back", failure)
    for resolved in entries:
        backend = resolved.backend
        assert isinstance(backend, McpBackend)
        if backend.tool == "*":
            for name, mcp_tool in connection.tools.items():
                _register_listed(registry, connection, name=name, mcp_tool=mcp_tool, resolved=resolved)
            continue
        listed = connection.tools.get(backend.tool)
        registry.add(
            name=resolved.name,
            description=resolved.definition.function.description or (listed.description if listed else "") or
            f"{backend.tool} on MCP server {connection.name}",
            parameters=listed.input_schema if listed else resolved.definition.function.parameters,
            executor=_caller(connection, backend.tool),
            source=source,
            timeout=resolved.timeout_seconds,
        )


def _register_listed(
    registry: ToolRegistry, connection: McpConnection, *, name: str, mcp_tool: Any, resolved: ResolvedTool
) -> None:
    """Register one tool a whole server brings; one the model could not call is skipped, not fatal."""
    local = name if name not in registry else f"{connection.name}_{name}"
    try:
        registry.add(
            name=local,
            description=mcp_tool.description or f"{name} on MCP server {connection.name}",
            parameters=mcp_tool.input_schema or {"type": "object"},
            executor=_caller(connection, name),
            source=f"mcp:{connection.name}",
            timeout=resolved.timeout_seconds,
        )
    except (ToolAlreadyExists, InvalidToolDefinition) as exc:
        log.warning("MCP server %r: not offering its tool %r to the model (mcp_invoke_tool can still call it): %s",
                    connection.name, name, exc)


def _caller(connection: McpConnection, tool_name: str):
    async def execute(args: dict[str, Any], context: ToolContext) -> str:
        return await connection.call(tool_name, args)

    return execute


def _register_management(registry: ToolRegistry, connections: dict[str, McpConnection]) -> None:
    def connection_for(server: str) -> McpConnection:
        for name, connection in connections.items():
            if name.lower() == server.lower():
                return connection
        raise ToolFailure(
            f"no MCP server named {server!r}; connected servers: {', '.join(connections)}",
            code=ErrorCode.INVALID_ARGUMENTS,
        )

    @tool(name="mcp_list_servers", source="mcp")
    async def mcp_list_servers() -> str:
        """List the MCP servers this agent is connected to, with their tools."""
        lines = []
        for name, connection in connections.items():
            try:
                await connection.session()
                tools = ", ".join(connection.reachable(registry=registry)) or "no tools"
                lines.append(f"- {name} ({connection.backend.transport}): {tools}")
            except ToolFailure as failure:
                lines.append(f"- {name} ({connection.backend.transport}): unavailable ({failure})")
        return "\n".join(lines)

    @tool(name="mcp_get_tool_schema", source="mcp")
    async def mcp_get_tool_schema(
        server: Annotated[str, Field(description="A server name from mcp_list_servers.")],
        tool_name: Annotated[str, Field(alias="tool", description="The tool's name on that server.")],
    ) -> str:
        """Show the description and JSON Schema of the arguments of a tool on an MCP server."""
        connection = connection_for(server)
        await connection.session()
        if (refused := connection.refusal(tool_name, registry=registry)) is not None:
            raise refused
        listed = connection.tools.get(tool_name)
        if listed is None:
            raise ToolFailure(
                f"MCP server {connection.name!r} has no tool {tool_name!r}; it has: "
                f"{', '.join(connection.reachable(registry=registry))}",
                code=ErrorCode.INVALID_ARGUMENTS,
            )
        return json.dumps({"name": listed.name, "description": listed.description, "parameters": listed.input_schema})

    @tool(name="mcp_invoke_tool", source="mcp")
    async def mcp_invoke_tool(
        server: Annotated[str, Field(description="A server name from mcp_list_servers.")],
        tool_name: Annotated[str, Field(alias="tool", description="The tool's name on that server.")],
        arguments: Annotated[dict[str, Any], Field(description="The tool's arguments as a JSON object.")] = {},  # noqa: B006
    ) -> str:
        """Call a tool on an MCP server with a JSON object of arguments (only tools this agent declares)."""
        connection = connection_for(server)
        if (refused := connection.refusal(tool_name, registry=registry)) is not None:
            raise refused
        return await connection.call(tool_name, arguments)

    for management in (mcp_list_servers, mcp_get_tool_schema, mcp_invoke_tool):
        registry.register(management)
