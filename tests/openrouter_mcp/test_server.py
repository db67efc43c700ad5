"""The OpenRouter MCP server over streamable HTTP, as an agent would use it."""

from __future__ import annotations

import os

import pytest
from mcp import Client
from pydantic import SecretStr

from rockbot.openrouter_mcp.client import OpenRouterClient, OpenRouterError
from rockbot.openrouter_mcp.server import build_server
from tests.openrouter_mcp.conftest import API_KEY, GENERATION, KEYS, MANAGEMENT_KEY, FakeOpenRouter, run_cli

TOOLS = {"get_credits", "get_key_usage", "get_api_key_info", "list_models", "get_generation", "list_api_keys",
         "get_api_key"}
ARGUMENTS = {"get_generation": {"generation_id": GENERATION["id"]}, "get_api_key": {"key_hash": KEYS[0]["hash"]}}


async def test_every_tool_is_declared_read_only(mcp_url: str) -> None:
    async with Client(mcp_url) as client:
        tools = (await client.list_tools()).tools
    assert {tool.name for tool in tools} == TOOLS
    for tool in tools:
        assert tool.annotations.read_only_hint is True, tool.name
        assert tool.annotations.destructive_hint is False, tool.name
        assert tool.description


async def test_credits_report_what_is_left(mcp_url: str, openrouter: FakeOpenRouter) -> None:
    async with Client(mcp_url) as client:
        result = await client.call_tool("get_credits", {})
    assert not result.is_error
    assert result.structured_content == {"total_credits": 50.0, "total_usage": 12.5, "remaining": 37.5}
    assert ("GET", "/api/v1/credits", f"Bearer {API_KEY}") in openrouter.requests


@pytest.mark.parametrize("name", ["get_key_usage", "get_api_key_info"])  # the design's name, an alias
async def test_key_usage_reports_limit_and_spend(mcp_url: str, name: str) -> None:
    async with Client(mcp_url) as client:
        result = await client.call_tool(name, {})
    usage = result.structured_content
    assert (usage["limit"], usage["limit_remaining"], usage["usage"]) == (20.0, 7.5, 12.5)
    assert (usage["usage_daily"], usage["usage_weekly"], usage["usage_monthly"]) == (0.5, 3.0, 12.5)
    assert usage["rate_limit"] == {"requests": 200, "interval": "10s"}


async def test_models_are_searched_sorted_and_priced_per_million_tokens(mcp_url: str) -> None:
    async with Client(mcp_url) as client:
        result = await client.call_tool("list_models", {"search": "GPT-4o", "max_results": 1})
    listing = result.structured_content
    assert listing["total_matches"] == 2
    assert listing["models"] == [{
        "id": "openai/gpt-4o",
        "name": "OpenAI: GPT-4o",
        "context_length": 128000,
        "max_completion_tokens": 16384,
        "prompt_usd_per_million_tokens": 2.5,
        "completion_usd_per_million_tokens": 10.0,
        "request_usd": 0.0,
    }]


async def test_generation_reports_tokens_and_cost(mcp_url: str) -> None:
    async with Client(mcp_url) as client:
        result = await client.call_tool("get_generation", {"generation_id": GENERATION["id"]})
    generation = result.structured_content
    assert generation["model"] == "openai/gpt-4o-mini"
    assert (generation["tokens_prompt"], generation["tokens_completion"]) == (120, 30)
    assert (generation["native_tokens_prompt"], generation["native_tokens_completion"]) == (118, 31)
    assert generation["total_cost"] == pytest.approx(0.0000363)


async def test_unknown_generation_is_a_tool_error_with_openrouters_reason(mcp_url: str) -> None:
    async with Client(mcp_url) as client:
        result = await client.call_tool("get_generation", {"generation_id": "gen-missing"})
    assert result.is_error
    text = result.content[0].text
    assert "404" in text and "Generation not found" in text
    assert API_KEY not in text


async def test_openrouter_only_ever_receives_reads(mcp_url: str, openrouter: FakeOpenRouter) -> None:
    async with Client(mcp_url) as client:
        for name in sorted(TOOLS):
            await client.call_tool(name, ARGUMENTS.get(name, {}))
    assert openrouter.requests
    assert {method for method, _, _ in openrouter.requests} == {"GET"}


async def test_a_refused_key_is_reported_without_the_key(openrouter: FakeOpenRouter) -> None:
    wrong = "sk-or-v1-wrong-key"
    client = OpenRouterClient(base_url=openrouter.base_url, api_key=SecretStr(wrong))
    try:
        with pytest.raises(OpenRouterError) as refused:
            await client.credits()
    finally:
        await client.close()
    assert "GET /credits answered 401: No auth credentials found" in str(refused.value)
    assert wrong not in str(refused.value)


def test_cli_without_a_key_stops_with_a_clear_message() -> None:
    env = {key: value for key, value in os.environ.items() if key != "OPENROUTER_API_KEY"}
    process = run_cli("--port", "0", env=env)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "OPENROUTER_API_KEY is not set" in stderr


async def test_api_keys_are_listed_with_the_management_key_only(mcp_url: str, openrouter: FakeOpenRouter) -> None:
    async with Client(mcp_url) as client:
        result = await client.call_tool("list_api_keys", {})
    keys = result.structured_content["keys"]
    assert [(key["name"], key["disabled"], key["usage"]) for key in keys] == [
        ("agents", False, 25.5), ("old", True, 3.25)]
    assert keys[0]["hash"] == KEYS[0]["hash"] and keys[0]["limit_remaining"] == 74.5
    assert ("GET", "/api/v1/keys", f"Bearer {MANAGEMENT_KEY}") in openrouter.requests
    assert not any(path.startswith("/api/v1/keys") and auth != f"Bearer {MANAGEMENT_KEY}"
                   for _, path, auth in openrouter.requests)


async def test_one_api_key_is_read_by_its_hash(mcp_url: str) -> None:
    async with Client(mcp_url) as client:
        found = await client.call_tool("get_api_key", {"key_hash": KEYS[1]["hash"]})
        missing = await client.call_tool("get_api_key", {"key_hash": "feedface"})
    assert found.structured_content["name"] == "old" and found.structured_content["limit"] is None
    assert missing.is_error and "404" in missing.content[0].text and "Key not found" in missing.content[0].text


async def test_without_a_management_key_the_key_tools_say_how_to_set_one(openrouter: FakeOpenRouter) -> None:
    client = OpenRouterClient(base_url=openrouter.base_url, api_key=SecretStr(API_KEY))
    try:
        async with Client(build_server(client=client, management=None)) as mcp:
            listed = await mcp.call_tool("list_api_keys", {})
            one = await mcp.call_tool("get_api_key", {"key_hash": KEYS[0]["hash"]})
    finally:
        await client.close()
    for result in (listed, one):
        assert result.is_error and "OPENROUTER_MANAGEMENT_KEY" in result.content[0].text
