"""`rockbot openrouter-mcp`: serve the read-only OpenRouter MCP server (streamable HTTP, or stdio)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pydantic import SecretStr

DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        choices=["streamable-http", "stdio"],
        default="streamable-http",
        help="serve over HTTP at /mcp (default) or over stdin/stdout",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (default: %(default)s)")
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENROUTER_BASE_URL", DEFAULT_BASE_URL),
        help="OpenRouter API base URL ($OPENROUTER_BASE_URL, default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    # The keys come only from the environment: a flag would show them in the process list. The management
    # key (OPENROUTER_MANAGEMENT_KEY) is optional: without it the two key-listing tools say how to set it.
    api_key = os.environ.get("OPENROUTER_API_KEY", "").strip()
    if not api_key:
        print(
            "rockbot openrouter-mcp: OPENROUTER_API_KEY is not set; export it with your OpenRouter API key "
            "(in the chart: openrouterMcp.apiKeySecret names the Secret holding it)",
            file=sys.stderr,
        )
        return 2
    management = os.environ.get("OPENROUTER_MANAGEMENT_KEY", "").strip()
    asyncio.run(_serve(args, api_key=SecretStr(api_key), management_key=SecretStr(management) if management else None))
    return 0


async def _serve(args: argparse.Namespace, *, api_key: SecretStr, management_key: SecretStr | None) -> None:
    from rockbot.openrouter_mcp.client import OpenRouterClient
    from rockbot.openrouter_mcp.server import build_server

    client = OpenRouterClient(base_url=args.base_url, api_key=api_key)
    management = OpenRouterClient(base_url=args.base_url, api_key=management_key) if management_key else None
    server = build_server(client=client, management=management)
    try:
        if args.transport == "stdio":
            await server.run_stdio_async()
        else:
            await server.run_streamable_http_async(host=args.host, port=args.port)
    finally:
        await client.close()
        if management is not None:
            await management.close()
