"""The read-only slice of the OpenRouter API the MCP server exposes, answers parsed into models."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, SecretStr

PER_MILLION = 1_000_000


class OpenRouterError(Exception):
    """OpenRouter refused or failed a request; the message says which endpoint and why (never the key)."""


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Credits(_Answer):
    """Credits bought and used on the whole account, in US dollars."""

    total_credits: float
    total_usage: float

    @property
    def remaining(self) -> float:
        return self.total_credits - self.total_usage


class RateLimit(_Answer):
    requests: int | None = None
    interval: str | None = None


class KeyInfo(_Answer):
    """The API key in use: its spending limit and what it has spent, in US dollars."""

    label: str | None = None
    limit: float | None = Field(default=None, description="Spending limit; null means unlimited.")
    limit_remaining: float | None = None
    usage: float = 0.0
    usage_daily: float | None = None
    usage_weekly: float | None = None
    usage_monthly: float | None = None
    is_free_tier: bool | None = None
    rate_limit: RateLimit | None = None


class Pricing(_Answer):
    """US dollars per token (OpenRouter sends decimal strings)."""

    prompt: float = 0.0
    completion: float = 0.0
    request: float = 0.0


class TopProvider(_Answer):
    context_length: int | None = None
    max_completion_tokens: int | None = None


class ModelInfo(_Answer):
    id: str
    name: str = ""
    context_length: int | None = None
    pricing: Pricing = Field(default_factory=Pricing)
    top_provider: TopProvider = Field(default_factory=TopProvider)


class Generation(_Answer):
    """One completed generation: its token counts and what it cost, in US dollars."""

    id: str
    model: str
    provider_name: str | None = None
    created_at: str | None = None
    tokens_prompt: int | None = None
    tokens_completion: int | None = None
    native_tokens_prompt: int | None = None
    native_tokens_completion: int | None = None
    native_tokens_reasoning: int | None = None
    total_cost: float = 0.0
    cache_discount: float | None = None
    latency: float | None = Field(default=None, description="Milliseconds until the first token.")
    generation_time: float | None = Field(default=None, description="Milliseconds spent generating.")
    finish_reason: str | None = None


class ApiKey(_Answer):
    """One API key of the account as the management API describes it (never the key itself)."""

    hash: str = Field(description="The key's id: what get_api_key takes.")
    name: str | None = None
    label: str | None = Field(default=None, description="A shortened form of the key, safe to show.")
    disabled: bool = False
    limit: float | None = Field(default=None, description="Spending limit; null means unlimited.")
    limit_remaining: float | None = None
    limit_reset: str | None = None
    usage: float = 0.0
    usage_daily: float | None = None
    usage_weekly: float | None = None
    usage_monthly: float | None = None
    created_at: str | None = None
    updated_at: str | None = None


class OpenRouterClient:
    """GETs against the OpenRouter API with the account's key; one HTTP session for its lifetime."""

    def __init__(self, *, base_url: str, api_key: SecretStr, timeout_seconds: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str, *, params: dict[str, str] | None = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={"Authorization": f"Bearer {self._api_key.get_secret_value()}"},
            )
        url = f"{self.base_url}{path}"
        try:
            async with self._session.get(url, params=params) as response:
                if response.status != 200:
                    raise OpenRouterError(f"GET {path} answered {response.status}: {await _reason(response)}")
                body = await response.json(content_type=None)
        except aiohttp.ClientError as error:
            raise OpenRouterError(f"GET {path} failed: {error}") from error
        if not isinstance(body, dict) or "data" not in body:
            raise OpenRouterError(f"GET {path} answered without a `data` field")
        return body["data"]

    async def credits(self) -> Credits:
        return Credits.model_validate(await self._get("/credits"))

    async def key(self) -> KeyInfo:
        return KeyInfo.model_validate(await self._get("/key"))

    async def models(self) -> list[ModelInfo]:
        return [ModelInfo.model_validate(item) for item in await self._get("/models")]

    async def generation(self, generation_id: str) -> Generation:
        return Generation.model_validate(await self._get("/generation", params={"id": generation_id}))

    async def api_keys(self) -> list[ApiKey]:
        """Needs a management key (OpenRouter refuses it to an ordinary one)."""
        return [ApiKey.model_validate(item) for item in await self._get("/keys")]

    async def api_key(self, key_hash: str) -> ApiKey:
        return ApiKey.model_validate(await self._get(f"/keys/{quote(key_hash, safe='')}"))


async def _reason(response: aiohttp.ClientResponse) -> str:
    """OpenRouter's own error message when it sent one, else the HTTP reason."""
    try:
        body = await response.json(content_type=None)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
        return response.reason or "no reason given"
