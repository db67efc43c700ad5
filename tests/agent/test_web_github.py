"""web_browse reads GitHub issues and pull requests through GitHub's REST API (a loopback stand-in here)."""

from __future__ import annotations

import pytest
from aiohttp import web

from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from tests.agent.configs import agent_config
from tests.agent.test_web_rest import serving

CONTEXT = ToolContext(session_id="s", tool_call_id="c1")
ISSUE = {
    "number": 12, "title": "Chunking can make a result bigger", "state": "open", "state_reason": None,
    "user": {"login": "alice"}, "labels": [{"name": "bug"}, {"name": "agent"}], "comments": 3,
    "body": "113 kB became 6,001 chunks.", "html_url": "https://github.com/rock/bot/issues/12",
    "created_at": "2026-11-20T10:00:00Z",
}
PULL = {
    "number": 7, "title": "Pack small sections", "state": "closed", "merged": True, "draft": False,
    "user": {"login": "bob"}, "labels": [], "comments": 0, "body": None, "base": {"ref": "main"},
    "head": {"ref": "pack"}, "html_url": "https://github.com/rock/bot/pull/7", "created_at": "2026-11-21T09:00:00Z",
}


@pytest.fixture
async def github():
    """GitHub's REST API as far as web_browse uses it; records what it was asked."""
    asked: list[tuple[str, str | None]] = []

    async def issue(request):
        asked.append((request.path, request.headers.get("Accept")))
        return web.json_response(ISSUE)

    async def pull(request):
        asked.append((request.path, request.headers.get("Accept")))
        return web.json_response(PULL)

    async def missing(request):
        asked.append((request.path, request.headers.get("Accept")))
        return web.json_response({"message": "Not Found"}, status=404)

    async def limited(request):
        return web.json_response({"message": "API rate limit exceeded for 198.51.100.7."}, status=403)

    app = web.Application()
    app.router.add_get("/repos/rock/bot/issues/12", issue)
    app.router.add_get("/repos/rock/bot/pulls/7", pull)
    app.router.add_get("/repos/rock/bot/issues/99", missing)
    app.router.add_get("/repos/rock/busy/issues/1", limited)
    async with serving(app, host="127.0.0.1") as url:
        yield url, asked


async def browse(scripted_llm, api_url: str, url: str):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["web"],
                          web_browse={"allowed_networks": ["127.0.0.1/32"], "github_api_url": api_url})
    async with AgentRuntime.from_config(config, env={}) as agent:
        return await agent.registry.invoke("web_browse", {"url": url}, context=CONTEXT)


async def test_an_issue_url_is_read_through_the_rest_api(github, scripted_llm):
    api_url, asked = github
    outcome = await browse(scripted_llm, api_url, "https://github.com/rock/bot/issues/12#issuecomment-1")
    assert asked == [("/repos/rock/bot/issues/12", "application/vnd.github+json")]
    assert outcome.content.splitlines()[:3] == [
        "# Chunking can make a result bigger (rock/bot#12)",
        "",
        "Issue · open · by @alice · labels: bug, agent · 3 comments · opened 2026-11-20T10:00:00Z",
    ]
    assert outcome.content.endswith("\n\n113 kB became 6,001 chunks.")


async def test_a_pull_request_url_is_read_through_the_pulls_endpoint(github, scripted_llm):
    api_url, asked = github
    outcome = await browse(scripted_llm, api_url, "https://github.com/rock/bot/pull/7/files")
    assert asked == [("/repos/rock/bot/pulls/7", "application/vnd.github+json")]
    assert "# Pack small sections (rock/bot#7)" in outcome.content
    assert "Pull request · merged · by @bob · main ← pack · 0 comments" in outcome.content
    assert outcome.content.endswith("(no description)")


async def test_a_missing_issue_and_a_rate_limit_are_errors_the_model_can_act_on(github, scripted_llm):
    api_url, _ = github
    missing = await browse(scripted_llm, api_url, "https://github.com/rock/bot/issues/99")
    limited = await browse(scripted_llm, api_url, "https://github.com/rock/busy/issues/1")
    assert missing.error.code == "ExecutionFailed" and not missing.error.retryable
    assert "GitHub has no issue rock/bot#99 (or it is private)" in missing.error.message
    assert limited.error.code == "Unavailable" and limited.error.retryable
    assert "API rate limit exceeded" in limited.error.message
