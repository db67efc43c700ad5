"""The MCP server: six read-only tools over an OpenRouter account (and `get_api_key_info`, the design's name for
`get_key_usage`), answers as structured data.

`list_api_keys` and `get_api_key` read OpenRouter's key-management API, which answers only a
management key: the server holds it separately (`OPENROUTER_MANAGEMENT_KEY`) and uses it for these two
GETs and nothing else, so the key that can create and delete keys is never used to do so here.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from rockbot.openrouter_mcp.client import (
    PER_MILLION,
    ApiKey,
    Generation,
    KeyInfo,
    ModelInfo,
    OpenRouterClient,
    OpenRouterError,
)

T = TypeVar("T")

READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=True)

INSTRUCTIONS = (
    "Read-only facts about the OpenRouter account behind this deployment: credits left, the API key's "
    "limit and spending, the models with their context lengths and prices, what a past generation "
    "cost, and the account's API keys with their limits and usage. Amounts are US dollars. Nothing here "
    "can change the account."
)
NO_MANAGEMENT_KEY = (
    "reading API keys needs an OpenRouter management key, which this server was not given: set "
    "OPENROUTER_MANAGEMENT_KEY (in the chart: openrouterMcp.managementKeySecret)"
)


class CreditsReport(BaseModel):
    total_credits: float = Field(description="Credits bought, in US dollars.")
    total_usage: float = Field(description="Credits used, in US dollars.")
    remaining: float = Field(description="Credits left, in US dollars.")


class ModelSummary(BaseModel):
    id: str = Field(description="The model id to put in a request, e.g. openai/gpt-4o-mini.")
    name: str
    context_length: int | None = Field(description="Tokens of context the model accepts.")
    max_completion_tokens: int | None = Field(description="Most tokens one answer may have, when limited.")
    prompt_usd_per_million_tokens: float
    completion_usd_per_million_tokens: float
    request_usd: float = Field(description="Fixed price per request, if any.")

    @classmethod
    def of(cls, model: ModelInfo) -> ModelSummary:
        return cls(
            id=model.id,
            name=model.name or model.id,
            context_length=model.context_length or model.top_provider.context_length,
            max_completion_tokens=model.top_provider.max_completion_tokens,
            prompt_usd_per_million_tokens=round(model.pricing.prompt * PER_MILLION, 6),
            completion_usd_per_million_tokens=round(model.pricing.completion * PER_MILLION, 6),
            request_usd=model.pricing.request,
        )


class ApiKeyList(BaseModel):
    keys: list[ApiKey]


class ModelList(BaseModel):
    total_matches: int = Field(description="Models matching the search; at most max_results are listed.")
    models: list[ModelSummary]


def build_server(*, client: OpenRouterClient, management: OpenRouterClient | None = None) -> MCPServer:
    """An MCP server whose every tool only reads from OpenRouter: through `client`, and through `management`
    (the management key's client, if any) for the two key tools."""
    server = MCPServer(name="openrouter", instructions=INSTRUCTIONS)

    @server.tool(annotations=READ_ONLY)
    async def get_credits() -> CreditsReport:
        """Credits bought, used and remaining on the OpenRouter account, in US dollars."""
        credits = await _ask(client.credits())
        return CreditsReport(
            total_credits=credits.total_credits, total_usage=credits.total_usage, remaining=credits.remaining
        )

    @server.tool(annotations=READ_ONLY)
    async def get_key_usage() -> KeyInfo:
        """The API key's spending limit (null = unlimited), what is left of it, and its daily/weekly/monthly spend."""
        return await _ask(client.key())

    @server.tool(annotations=READ_ONLY)
    async def get_api_key_info() -> KeyInfo:
        """The same as get_key_usage (the design's name for it): the API key's limit, what is left, its spend."""
        return await _ask(client.key())

    @server.tool(annotations=READ_ONLY)
    async def list_models(
        search: str = Field(default="", description="Case-insensitive text to find in the model id or name."),
        max_results: int = Field(default=50, ge=1, le=500, description="Most models to list."),
    ) -> ModelList:
        """Models on OpenRouter with context lengths and prices (US dollars per million tokens), sorted by id."""
        needle = search.casefold()
        matches = sorted(
            (m for m in await _ask(client.models()) if needle in m.id.casefold() or needle in m.name.casefold()),
            key=lambda m: m.id,
        )
        return ModelList(total_matches=len(matches), models=[ModelSummary.of(m) for m in matches[:max_results]])

    @server.tool(annotations=READ_ONLY)
    async def get_generation(
        generation_id: str = Field(min_length=1, description="The id OpenRouter gave the completion (gen-...)."),
    ) -> Generation:
        """One past generation's model, token counts (as billed and native) and total cost in US dollars."""
        return await _ask(client.generation(generation_id))

    @server.tool(annotations=READ_ONLY)
    async def list_api_keys() -> ApiKeyList:
        """The account's API keys (by hash and shortened label, never the keys): limits, spend, whether disabled."""
        if management is None:
            raise ToolError(NO_MANAGEMENT_KEY)
        return ApiKeyList(keys=await _ask(management.api_keys()))

    @server.tool(annotations=READ_ONLY)
    async def get_api_key(
        key_hash: str = Field(min_length=1, max_length=256, description="A key's hash from list_api_keys."),
    ) -> ApiKey:
        """One API key's limit, what is left of it, its daily/weekly/monthly spend and whether it is disabled."""
        if management is None:
            raise ToolError(NO_MANAGEMENT_KEY)
        return await _ask(management.api_key(key_hash))

    return server


async def _ask(request: Awaitable[T]) -> T:
    """OpenRouter's refusals become tool errors the model can read, not crashes."""
    try:
        return await request
    except OpenRouterError as error:
        raise ToolError(str(error)) from error
