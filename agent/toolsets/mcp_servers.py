"""The `mcp` set: MCP-backed Tools through the official `mcp` SDK (streamable HTTP, SSE, stdio) and the
five tools that manage them.

Each server named by the config's MCP tools gets one long-lived connection. The SDK's transports
are anyio context managers that must be entered and left by the same task, so each connection
lives in its own task and tool calls borrow its session. At start the server's tools are listed:
a tool whose backend names `tool: "*"` brings every tool of the server under its own name (a name
another source holds is not offered, by the rule in `rockbot.contracts.tool_names`), a named one is
registered under the Tool's name with the server's input schema. Everything registered from a
server has source `mcp:<server>`. A server's credentials (headers from Secrets for HTTP, environment
from Secrets for stdio) are read from the env vars the operator wired and given to that server only;
a stdio server otherwise gets the SDK's minimal environment, never the agent's.

A server that is down at start does not stop the agent: its named tools are registered from the
config and answer `Unavailable` (retryable) until a call finds the server back; a connection
that breaks is reopened on the next call. Nor does a slow one: the agent waits `STARTUP_WAIT_SECONDS`
for its servers, and one still starting then goes on connecting beside it; its tools are offered once
it is ready (or, if it fails, its named ones answer Unavailable). Both are said in `kit.notices`.
A stdio server's stderr never reaches the terminal or the pod's output raw: each line is logged
under the server's name, and the last of them are in the warning when the server fails.

The management tools (the design's five, under these names):

| design                                     | rockbot                                |
| ------------------------------------------ | -------------------------------------- |
| `mcp_list_services`                        | `mcp_list_servers()`                   |
| `mcp_get_service_details(server, tool?)`   | `mcp_get_tool_schema(server, tool?)`   |
| `mcp_invoke_tool(server, tool, arguments)` | `mcp_invoke_tool(server, tool, arguments)` |
| `mcp_register_server(name, command, args)` | `mcp_register_server(server)`          |
| `mcp_unregister_server(name)`              | `mcp_unregister_server(server)`        |

They reach no further than the Agent's Tool resources do: a server tool is reachable only if a Tool
names it (or names `tool: "*"` on that server), and not if the agent's blacklist names it. Otherwise
`mcp_invoke_tool` would be a back door around both the declared tools and the blacklist.

Attaching at run time is the riskiest of them: a model that a web page talked round could start any
command in the agent's pod or send data to any URL. So `mcp_register_server` takes a server *name*
only, never a command or URL, and attaches only a server an accepted Tool in the agent's namespace
already declares (the operator lists them in `mcp_catalog`, with their Secret-backed credentials wired),
and only for an Agent that enables the `mcp` set itself. An attached server's tools are reached through
`mcp_invoke_tool` (not offered by name, so what the model is offered stays what `status.tools` says),
minus blacklisted ones; `mcp_unregister_server` detaches it again. Attachments last for this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
from collections import deque
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Annotated, Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import Field

from rockbot.agent.defining import tool
from rockbot.agent.registry import InvalidToolDefinition, Tool, ToolContext, ToolFailure, ToolRegistry
from rockbot.agent.toolsets.kit import Guide, ToolKit, catalogue_description
from rockbot.contracts.agent_config import McpBackend, McpServer, ResolvedTool
from rockbot.contracts.builtin_tools import enabled_builtin_tools
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.tool_names import ToolRank

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 15.0
#: How long an agent's start waits for its MCP servers; slower ones keep connecting beside it.
STARTUP_WAIT_SECONDS = 10.0
#: Lines of a stdio server's stderr kept for the warning when it fails.
STDERR_LINES_KEPT = 20

GUIDE = Guide(
    name="mcp-tools",
    summary="Finding and calling tools on the connected MCP servers.",
    document=(
        "# MCP tools\n\n"
        "1. `mcp_list_servers()` lists the connected MCP servers and their tools (and any you may attach).\n"
        "2. `mcp_get_tool_schema(server, tool)` shows what arguments a tool takes (without `tool`: all of them).\n"
        "3. `mcp_invoke_tool(server, tool, arguments)` calls it with a JSON object of arguments.\n"
        "4. Where offered, `mcp_register_server(server)` attaches one of the listed attachable servers and "
        "`mcp_unregister_server(server)` detaches it.\n"
        "Tools that are registered directly (source `mcp:<server>`) can also be called by name.\n"
    ),
)


class McpConnection:
    """One server, one session, held open by a dedicated task and reopened when it breaks."""

    def __init__(self, *, server: McpServer, env: Mapping[str, str], declares_all: bool = False):
        self.name = server.server
        self.server = server
        self.tools: dict[str, Any] = {}  # name -> mcp Tool (name, description, inputSchema)
        self.declared: dict[str, set[str]] = {}  # server tool -> local names the Tool resources give it
        self.declares_all = declares_all  # a Tool names `tool: "*"`, or the server was attached whole
        self._env = env
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return f"{self.server.transport} {self.server.url or shlex.join(self.server.command)}"

    def _secret(self, env: str, *, what: str) -> str:
        value = self._env.get(env)
        if not value:
            raise ValueError(f"{what} comes from env var {env}, which is empty (the operator wires it from a Secret)")
        return value

    async def _enter_transport(self, stack: AsyncExitStack, *, stderr: StderrLog):
        server = self.server
        if server.transport == "stdio":
            env = {name: self._secret(ref.env, what=f"env {name}") for name, ref in server.env.items()}
            command, *args = server.command
            parameters = StdioServerParameters(command=command, args=args, env=env or None)
            with stderr.writer() as errlog:  # the child holds its own copy; ours closes once it is started
                return await stack.enter_async_context(stdio_client(parameters, errlog=errlog))
        headers = {
            name: header.prefix + self._secret(header.env, what=f"header {name}")
            for name, header in server.headers.items()
        }
        if server.transport == "sse":
            return await stack.enter_async_context(sse_client(server.url, headers=headers or None))
        client = await stack.enter_async_context(create_mcp_http_client(headers=headers or None))
        return await stack.enter_async_context(streamable_http_client(server.url, http_client=client))

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
                raise ToolFailure(
                    f"MCP server {self.name!r} ({self.where}) is unavailable: {reason(exc)}",
                    code=ErrorCode.UNAVAILABLE,
                    retryable=True,
                ) from exc
            try:
                listing = await self._session.list_tools()
            except Exception as exc:
                await self.close()
                raise ToolFailure(
                    f"MCP server {self.name!r} is connected but cannot list its tools: {reason(exc)}",
                    code=ErrorCode.UNAVAILABLE,
                    retryable=True,
                ) from exc
            self.tools = {t.name: t for t in listing.tools}
            return self._session

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        stderr = StderrLog(server=self.name)
        try:
            async with AsyncExitStack() as stack:
                stack.push_async_callback(stderr.close)
                streams = await self._enter_transport(stack, stderr=stderr)
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                if not ready.done():
                    ready.set_exception(ConnectionError("cancelled while connecting"))
                raise
            if stderr.last:
                log.warning("MCP server %r (%s) failed; the last lines it wrote to stderr:\n%s", self.name,
                            self.where, "\n".join(stderr.last))  # fmt: skip
            if not ready.done():  # the caller reports a failed connect
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
            else:
                log.warning("MCP server %r (%s): connection ended: %s", self.name, self.where, reason(exc))
        finally:
            self._session = None

    async def call(self, tool_name: str, arguments: dict[str, Any], *, registry: ToolRegistry) -> str:
        session = await self.session()
        if tool_name not in self.tools:
            raise ToolFailure(
                f"MCP server {self.name!r} has no tool {tool_name!r}; reachable here: "
                f"{', '.join(self.reachable(registry=registry)) or 'none'}",
                code=ErrorCode.TOOL_NOT_FOUND,
            )
        try:
            result = await session.call_tool(tool_name, arguments)
        except Exception as exc:
            await self.close()  # a broken connection is reopened by the next call
            raise ToolFailure(
                f"MCP call {self.name}/{tool_name} failed: {reason(exc)}",
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
            names.add(tool_name)
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
            if self._session is None:  # still connecting: there is no session to end politely
                holder.cancel()
            else:
                try:
                    async with asyncio.timeout(5):
                        await asyncio.shield(holder)
                except (TimeoutError, Exception):
                    holder.cancel()
            with contextlib.suppress(BaseException):
                await holder
        self._session = None


class StderrLog:
    """A stdio server's stderr: a pipe whose lines are logged under the server's name as they come (the last few
    kept for the warning when it fails), instead of the agent's own stderr, where they would land in the chat."""

    def __init__(self, *, server: str) -> None:
        self.server = server
        self.last: deque[str] = deque(maxlen=STDERR_LINES_KEPT)
        self._reader: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def writer(self):
        """The write end to give the child; the reading starts with it."""
        read_end, write_end = os.pipe()
        self._reader = asyncio.create_task(self._read(os.fdopen(read_end, "rb", buffering=0)),
                                           name=f"mcp:{self.server} stderr")  # fmt: skip
        with os.fdopen(write_end, "w", encoding="utf-8") as errlog:
            yield errlog

    async def close(self) -> None:
        """Read what the child still wrote (it ends when the child and every copy of the write end are gone)."""
        if self._reader is not None:
            try:
                async with asyncio.timeout(2):
                    await asyncio.shield(self._reader)
            except (TimeoutError, Exception):
                self._reader.cancel()

    async def _read(self, pipe) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            while line := await reader.readline():
                text = line.decode("utf-8", errors="replace").rstrip()
                if text:
                    self.last.append(text)
                    log.info("MCP server %r stderr: %s", self.server, text)
        finally:
            transport.close()


def reason(exc: BaseException) -> str:
    """Why a connection failed, in words: the leaves of an exception group (anyio's task groups wrap the
    real cause in 'unhandled errors in a TaskGroup'), each as `Type: message`, once."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(reason(inner) for inner in exc.exceptions))
    text = str(exc) or "no details"
    return f"{type(exc).__name__}: {text}"


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


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    """Connect the declared servers, register their tools and the management tools."""
    declared = [resolved for resolved in kit.config.tools if isinstance(resolved.backend, McpBackend)]
    by_server: dict[str, list[ResolvedTool]] = {}
    for resolved in declared:
        assert isinstance(resolved.backend, McpBackend)
        by_server.setdefault(resolved.backend.server, []).append(resolved)
    connections: dict[str, McpConnection] = {}
    for server, entries in by_server.items():
        first = entries[0].backend
        assert isinstance(first, McpBackend)
        connection = connections[server] = McpConnection(server=first.connection(), env=kit.env)
        for resolved in entries:
            backend = resolved.backend
            assert isinstance(backend, McpBackend)
            if backend.tool == "*":
                connection.declares_all = True
            else:
                connection.declared.setdefault(backend.tool, set()).add(resolved.name)

    starts = {
        asyncio.create_task(_start_server(registry, connections[server], by_server[server], kit=kit),
                            name=f"mcp:{server} start"): server
        for server in by_server
    }  # fmt: skip

    async def close_all() -> None:
        for start in starts:
            start.cancel()
        await asyncio.gather(*starts, return_exceptions=True)
        await asyncio.gather(*(connection.close() for connection in connections.values()))

    kit.closers.append(close_all)
    offered = {builtin.name for builtin in enabled_builtin_tools(kit.config)}  # attaching: the `mcp` set only
    for management in _management_tools(registry, connections, kit=kit):
        if management.name in offered:
            registry.register(management)
    if starts:
        _, slow = await asyncio.wait(starts, timeout=STARTUP_WAIT_SECONDS)
        for start in slow:
            server = starts[start]
            kit.notices.append(f"MCP server {server!r} is still starting: the agent starts without its tools, which "
                               "are offered once it is ready")  # fmt: skip
            log.warning("MCP server %r (%s) %s", server, connections[server].where, "is still starting: the agent "
                        "starts without it and offers its tools once it is ready")  # fmt: skip
    kit.guides.add(GUIDE)


async def _start_server(
    registry: ToolRegistry, connection: McpConnection, entries: list[ResolvedTool], *, kit: ToolKit
) -> None:
    """Connect, then register the server's tools (a server that is down: its named ones, from the config)."""
    try:
        await connection.session()
    except ToolFailure as failure:
        log.warning("%s; its tools answer Unavailable until it is back", failure)
        kit.notices.append(f"MCP server {connection.name!r} failed to start, so its tools answer Unavailable until "
                           "it is back (the log says why)")  # fmt: skip
    _register_server(registry, connection, entries)


def _register_server(registry: ToolRegistry, connection: McpConnection, entries: list[ResolvedTool]) -> None:
    source = f"mcp:{connection.name}"
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
            executor=_caller(connection, backend.tool, registry=registry),
            source=source,
            timeout=resolved.timeout_seconds,
            rank=ToolRank.DECLARED,
        )


def _register_listed(
    registry: ToolRegistry, connection: McpConnection, *, name: str, mcp_tool: Any, resolved: ResolvedTool
) -> None:
    """Register one tool a whole server brings; one the model could not call is skipped, not fatal."""
    try:
        registry.add(
            name=name,
            description=mcp_tool.description or f"{name} on MCP server {connection.name}",
            parameters=mcp_tool.input_schema or {"type": "object"},
            executor=_caller(connection, name, registry=registry),
            source=f"mcp:{connection.name}",
            timeout=resolved.timeout_seconds,
            rank=ToolRank.LISTED,
        )
    except InvalidToolDefinition as exc:
        log.warning("MCP server %r: not offering its tool %r to the model (mcp_invoke_tool can still call it): %s",
                    connection.name, name, exc)


def _caller(connection: McpConnection, tool_name: str, *, registry: ToolRegistry):
    async def execute(args: dict[str, Any], context: ToolContext) -> str:
        return await connection.call(tool_name, args, registry=registry)

    return execute


def _management_tools(registry: ToolRegistry, connections: dict[str, McpConnection], *, kit: ToolKit) -> list[Tool]:
    catalog = {server.server: server for server in kit.config.mcp_catalog}
    attached: set[str] = set()

    def connection_for(server: str) -> McpConnection:
        for name, connection in connections.items():
            if name.lower() == server.lower():
                return connection
        attachable = sorted(set(catalog) - set(connections))
        raise ToolFailure(
            f"no MCP server named {server!r}; connected servers: {', '.join(connections) or 'none'}"
            + (f"; attachable with mcp_register_server: {', '.join(attachable)}" if attachable else ""),
            code=ErrorCode.INVALID_ARGUMENTS,
        )

    def describe(connection: McpConnection, tool_name: str) -> dict[str, Any]:
        listed = connection.tools[tool_name]
        return {"name": listed.name, "description": listed.description, "parameters": listed.input_schema}

    @tool(name="mcp_list_servers", description=catalogue_description("mcp_list_servers"))
    async def mcp_list_servers() -> str:
        lines = []
        for name, connection in list(connections.items()):
            how = connection.server.transport + (", attached" if name in attached else "")
            try:
                await connection.session()
                tools = ", ".join(connection.reachable(registry=registry)) or "no tools"
                lines.append(f"- {name} ({how}): {tools}")
            except ToolFailure as failure:
                lines.append(f"- {name} ({how}): unavailable ({failure})")
        lines += [f"- {name} (not attached: mcp_register_server can attach it)" for name in catalog if
                  name not in connections]
        return "\n".join(lines) or "No MCP servers."

    @tool(name="mcp_get_tool_schema", description=catalogue_description("mcp_get_tool_schema"))
    async def mcp_get_tool_schema(
        server: Annotated[str, Field(description="A server name from mcp_list_servers.")],
        tool_name: Annotated[
            str | None, Field(alias="tool", description="The tool's name on that server; omit for all its tools.")
        ] = None,
    ) -> str:
        connection = connection_for(server)
        await connection.session()
        if tool_name is None:
            return json.dumps([describe(connection, name) for name in connection.reachable(registry=registry)])
        if (refused := connection.refusal(tool_name, registry=registry)) is not None:
            raise refused
        if tool_name not in connection.tools:
            raise ToolFailure(
                f"MCP server {connection.name!r} has no tool {tool_name!r}; it has: "
                f"{', '.join(connection.reachable(registry=registry))}",
                code=ErrorCode.INVALID_ARGUMENTS,
            )
        return json.dumps(describe(connection, tool_name))

    @tool(name="mcp_invoke_tool", description=catalogue_description("mcp_invoke_tool"))
    async def mcp_invoke_tool(
        server: Annotated[str, Field(description="A server name from mcp_list_servers.")],
        tool_name: Annotated[str, Field(alias="tool", description="The tool's name on that server.")],
        arguments: Annotated[dict[str, Any], Field(description="The tool's arguments as a JSON object.")] = {},  # noqa: B006
    ) -> str:
        connection = connection_for(server)
        if (refused := connection.refusal(tool_name, registry=registry)) is not None:
            raise refused
        return await connection.call(tool_name, arguments, registry=registry)

    @tool(name="mcp_register_server", description=catalogue_description("mcp_register_server"))
    async def mcp_register_server(
        server: Annotated[str, Field(description="The name of an attachable server from mcp_list_servers.")],
    ) -> str:
        found = next((entry for name, entry in catalog.items() if name.lower() == server.lower()), None)
        if found is None:
            raise ToolFailure(
                f"no attachable MCP server named {server!r}: only servers that Tools in this agent's namespace "
                f"declare can be attached, by name; attachable: {', '.join(sorted(catalog)) or 'none'}",
                code=ErrorCode.INVALID_ARGUMENTS,
            )
        if found.server in connections:
            return f"MCP server {found.server!r} is already attached."
        connection = McpConnection(server=found, env=kit.env, declares_all=True)
        await connection.session()  # down: Unavailable, and nothing is kept
        connections[found.server] = connection
        attached.add(found.server)
        tools = ", ".join(connection.reachable(registry=registry)) or "no tools"
        return f"Attached MCP server {found.server!r}; call its tools with mcp_invoke_tool: {tools}"

    @tool(name="mcp_unregister_server", description=catalogue_description("mcp_unregister_server"))
    async def mcp_unregister_server(
        server: Annotated[str, Field(description="A server that mcp_register_server attached.")],
    ) -> str:
        connection = connection_for(server)
        if connection.name not in attached:
            raise ToolFailure(
                f"MCP server {connection.name!r} comes from this agent's own Tools and stays; only servers "
                "attached with mcp_register_server can be detached",
                code=ErrorCode.REJECTED,
            )
        attached.discard(connection.name)
        del connections[connection.name]
        await connection.close()
        return f"Detached MCP server {connection.name!r}."

    return [mcp_list_servers, mcp_get_tool_schema, mcp_invoke_tool, mcp_register_server, mcp_unregister_server]
