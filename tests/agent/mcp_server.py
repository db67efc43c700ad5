"""A small MCP server for tests, built with the official SDK.

    python tests/agent/mcp_server.py stdio
    python tests/agent/mcp_server.py streamable-http   # prints the port it bound on 127.0.0.1 first
    python tests/agent/mcp_server.py sse
    python tests/agent/mcp_server.py stdio-unlistable   # answers every tools/list with an error
"""

import asyncio
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("rocks")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def hardness(mineral: str) -> str:
    """Mohs hardness of a mineral."""
    scale = {"talc": 1, "quartz": 7, "diamond": 10}
    if mineral not in scale:
        raise ToolError(f"unknown mineral {mineral!r}")
    return f"{mineral}: {scale[mineral]}"


@server.tool(name="rock.density")
def density(mineral: str) -> str:
    """A valid MCP tool name that is not a valid OpenAI function name (the dot)."""
    return f"{mineral}: 2.7"


class Unlistable(MCPServer):
    async def list_tools(self):
        raise RuntimeError("the tool catalogue is being rebuilt")


if __name__ == "__main__":
    transport = sys.argv[1]
    if transport == "stdio-unlistable":
        Unlistable("broken").run("stdio")
    elif transport == "stdio":
        server.run("stdio")
    else:
        # Bind port 0 here and say which port it got: no free-port guess that another process could take first.
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        print(listening.getsockname()[1], flush=True)
        app = server.streamable_http_app() if transport == "streamable-http" else server.sse_app()
        config = uvicorn.Config(app, log_level="warning")
        asyncio.run(uvicorn.Server(config).serve(sockets=[listening]))
