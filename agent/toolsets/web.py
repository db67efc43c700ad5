"""The `web` set: `web_browse(url)` reads a page as Markdown; `web_search(query)` asks a search provider.

Browsing parses HTML with BeautifulSoup (stdlib parser, no native build) and converts it with
markdownify, after removing what is noise to a reader model: scripts, styles, navigation, headers,
footers, asides, forms, frames and SVG. Only http(s) URLs are fetched; pages are capped at
`MAX_PAGE_BYTES`. Browsing has its own HTTP session whose connector refuses non-public addresses
(see `rockbot.agent.egress`; `web_browse.allowed_networks` opens some), because the model picks the
URL: it must not reach loopback, cluster services or the cloud metadata endpoint, neither
directly nor through a redirect. A long page is not cut here: the loop splits any long result into
working memory chunks (headings first), so the model reads it section by section.

GitHub issue and pull-request URLs (`github.com/<owner>/<repo>/issues/<n>`, `.../pull/<n>`) are read
through GitHub's REST API instead (`web_browse.github_api_url`, https://api.github.com by default):
title, state, author, labels and body, not a page rendered for people. Public repositories need no
token; the same egress checks apply.

Search providers are pluggable (`SearchProvider`): SearXNG's JSON API (`url` = the instance) and
Brave's Web Search API (key from the Secret-backed env var; `url` overrides the endpoint). With
no `web_search` config the tool is not offered at all.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from bs4 import BeautifulSoup
from markdownify import markdownify
from pydantic import BaseModel, Field

from rockbot.agent.defining import tool
from rockbot.agent.egress import AddressRefused, EgressPolicy
from rockbot.agent.registry import ToolFailure, ToolRegistry
from rockbot.agent.toolsets.kit import Guide, ToolKit, catalogue_description
from rockbot.contracts.agent_config import WebSearchConfig
from rockbot.contracts.errors import ErrorCode

MAX_PAGE_BYTES = 5 * 1024 * 1024
BROWSE_TIMEOUT_SECONDS = 60.0
BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
_GITHUB_PAGE = re.compile(r"^/(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+)/(?P<kind>issues|pull)/(?P<number>\d+)(/.*)?$")
_NOISE = ["script", "style", "noscript", "nav", "header", "footer", "aside", "form", "iframe", "svg", "template"]

GUIDE = Guide(
    name="web-tools",
    summary="Searching the web and reading pages as Markdown.",
    document=(
        "# Web tools\n\n"
        "- `web_search(query, count)` returns titles, URLs and snippets. Search first, then browse the "
        "most promising results.\n"
        "- `web_browse(url)` returns the page's main content as Markdown (navigation, scripts and footers "
        "removed). Long pages come back as an index of chunks: read them with `get_from_working_memory`.\n"
        "- Only http and https URLs can be browsed.\n"
    ),
)


class SearchResult(BaseModel):
    title: str
    url: str
    snippet: str = ""


class SearchProvider(Protocol):
    async def search(self, *, session: aiohttp.ClientSession, query: str, count: int) -> list[SearchResult]: ...


class SearxngProvider:
    def __init__(self, *, url: str):
        self.url = url.rstrip("/")

    async def search(self, *, session: aiohttp.ClientSession, query: str, count: int) -> list[SearchResult]:
        data = await _get_json(session, f"{self.url}/search", params={"q": query, "format": "json"}, headers={})
        return [
            SearchResult(title=item.get("title") or item["url"], url=item["url"], snippet=item.get("content", ""))
            for item in data.get("results", [])[:count]
            if item.get("url")
        ]


class BraveProvider:
    def __init__(self, *, api_key: str, url: str | None = None):
        self.api_key = api_key
        self.url = url or BRAVE_URL

    async def search(self, *, session: aiohttp.ClientSession, query: str, count: int) -> list[SearchResult]:
        headers = {"X-Subscription-Token": self.api_key, "Accept": "application/json"}
        data = await _get_json(session, self.url, params={"q": query, "count": str(count)}, headers=headers)
        return [
            SearchResult(title=item.get("title", ""), url=item["url"], snippet=item.get("description", ""))
            for item in (data.get("web") or {}).get("results", [])[:count]
            if item.get("url")
        ]


def search_provider(config: WebSearchConfig, *, kit: ToolKit) -> SearchProvider:
    """Build the configured provider; a missing URL or key is a clear startup error."""
    if config.provider == "searxng":
        if not config.url:
            raise ValueError("web_search.url: the SearXNG provider needs the instance URL, e.g. http://searxng:8080")
        return SearxngProvider(url=config.url)
    key = kit.secret(config.api_key.env) if config.api_key else None
    if not key:
        env = config.api_key.env if config.api_key else "(none configured)"
        raise ValueError(f"web_search.api_key: the Brave provider needs an API key in env var {env}")
    return BraveProvider(api_key=key, url=config.url)


async def _get_json(session: aiohttp.ClientSession, url: str, *, params: dict[str, str], headers: dict[str, str]):
    try:
        async with session.get(url, params=params, headers=headers) as response:
            if response.status != 200:
                text = (await response.text())[:300]
                retryable = response.status == 429 or response.status >= 500
                raise ToolFailure(
                    f"the search provider answered HTTP {response.status}: {text}",
                    code=ErrorCode.UNAVAILABLE if retryable else ErrorCode.EXECUTION_FAILED,
                    retryable=retryable,
                )
            return await response.json(content_type=None)
    except aiohttp.ClientError as exc:
        raise ToolFailure(
            f"cannot reach the search provider: {exc}", code=ErrorCode.UNAVAILABLE, retryable=True
        ) from exc


async def _github_reason(response: aiohttp.ClientResponse) -> str:
    try:
        return str((await response.json(content_type=None))["message"])
    except (ValueError, KeyError, TypeError):
        return response.reason or "no reason given"


def html_to_markdown(html: str) -> str:
    """The page's readable content as Markdown, noise removed."""
    soup = BeautifulSoup(html, "html.parser")
    for element in soup.find_all(_NOISE):
        element.decompose()
    title = soup.title.get_text(strip=True) if soup.title else ""
    if soup.head is not None:
        soup.head.decompose()
    body = soup.find("main") or soup.find("article") or soup.body or soup
    markdown = markdownify(str(body), heading_style="ATX", strip=["img"]).strip()
    lines = [line.rstrip() for line in markdown.splitlines()]
    collapsed: list[str] = []
    for line in lines:
        if line or (collapsed and collapsed[-1]):
            collapsed.append(line)
    text = "\n".join(collapsed).strip()
    return f"# {title}\n\n{text}" if title and not text.startswith("# ") else text


def github_item(url: str) -> tuple[str, str, int] | None:
    """(`owner/repo`, `issues` or `pulls`, number) for a GitHub issue or pull-request URL, else None."""
    parts = urlsplit(url)
    match = _GITHUB_PAGE.match(parts.path) if parts.hostname in ("github.com", "www.github.com") else None
    if match is None:
        return None
    endpoint = "pulls" if match["kind"] == "pull" else "issues"
    return f"{match['owner']}/{match['repo']}", endpoint, int(match["number"])


def github_markdown(item: dict[str, Any], *, repository: str, endpoint: str) -> str:
    """An issue or pull request from the REST API as Markdown: title, state, author, labels, body."""
    kind = "Pull request" if endpoint == "pulls" or "pull_request" in item else "Issue"
    state = "merged" if item.get("merged") else "draft" if item.get("draft") else item.get("state", "unknown")
    facts = [kind, state, f"by @{(item.get('user') or {}).get('login', 'unknown')}"]
    if endpoint == "pulls":
        facts.append(f"{(item.get('base') or {}).get('ref', '?')} ← {(item.get('head') or {}).get('ref', '?')}")
    labels = [label["name"] for label in item.get("labels") or [] if isinstance(label, dict) and "name" in label]
    if labels:
        facts.append(f"labels: {', '.join(labels)}")
    facts += [f"{item.get('comments', 0)} comments", f"opened {item.get('created_at', '?')}"]
    body = (item.get("body") or "").strip() or "(no description)"
    return f"# {item.get('title', '')} ({repository}#{item.get('number')})\n\n{' · '.join(facts)}\n\n{body}"


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    policy = EgressPolicy(allowed_networks=kit.config.web_browse.allowed_networks)
    browsing = aiohttp.ClientSession(
        connector=policy.connector(),
        timeout=aiohttp.ClientTimeout(total=BROWSE_TIMEOUT_SECONDS),
        headers={"User-Agent": "rockbot-agent"},
    )
    kit.closers.append(browsing.close)
    github_api = kit.config.web_browse.github_api_url.rstrip("/")

    async def read_github(url: str, repository: str, endpoint: str, number: int) -> str:
        api_url = f"{github_api}/repos/{repository}/{endpoint}/{number}"
        async with browsing.get(api_url, headers={"Accept": "application/vnd.github+json"}) as response:
            if response.status == 200:
                return github_markdown(await response.json(content_type=None), repository=repository,
                                       endpoint=endpoint)
            reason = await _github_reason(response)
        what = "pull request" if endpoint == "pulls" else "issue"
        if response.status == 404:
            raise ToolFailure(f"GitHub has no {what} {repository}#{number} (or it is private): {reason}")
        retryable = response.status in (403, 429) or response.status >= 500  # 403/429: GitHub's rate limits
        raise ToolFailure(
            f"GitHub's API answered HTTP {response.status} for {url}: {reason}",
            code=ErrorCode.UNAVAILABLE if retryable else ErrorCode.EXECUTION_FAILED,
            retryable=retryable,
        )

    @tool(name="web_browse", description=catalogue_description("web_browse"))
    async def web_browse(url: Annotated[str, Field(description="An absolute http:// or https:// URL.")]) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ToolFailure(
                f"web_browse only fetches absolute http(s) URLs; {url!r} is not one (give e.g. https://example.org/page)",
                code=ErrorCode.INVALID_ARGUMENTS,
            )
        item = github_item(url)
        try:
            if item is not None:
                return await read_github(url, *item)
            async with browsing.get(url, headers={"Accept": "text/html, text/plain;q=0.9, */*;q=0.5"}) as response:
                if response.status >= 400:
                    raise ToolFailure(
                        f"{url} answered HTTP {response.status}",
                        retryable=response.status == 429 or response.status >= 500,
                    )
                data = await response.content.read(MAX_PAGE_BYTES + 1)
                kind = response.content_type
                charset = response.charset or "utf-8"
        except aiohttp.ClientError as exc:
            refused = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else None
            if isinstance(refused, AddressRefused):
                prefix = 128 if ":" in refused.address else 32
                raise ToolFailure(
                    f"web_browse refused {url}: it (or a redirect from it) leads to {refused.address}, "
                    f"{refused.reason}, which is not on the public internet; to let this agent reach it, add "
                    f"its network to web_browse.allowed_networks in the agent config (e.g. {refused.address}/{prefix})",
                    code=ErrorCode.REJECTED,
                ) from exc
            raise ToolFailure(f"cannot fetch {url}: {exc}", code=ErrorCode.UNAVAILABLE, retryable=True) from exc
        note = f"\n\n[page truncated at {MAX_PAGE_BYTES} bytes]" if len(data) > MAX_PAGE_BYTES else ""
        text = data[:MAX_PAGE_BYTES].decode(charset, errors="replace")
        if kind in ("text/html", "application/xhtml+xml"):
            text = html_to_markdown(text)
        elif not (kind.startswith("text/") or kind.endswith(("json", "xml"))):
            raise ToolFailure(f"{url} is {kind}, not a page that can be read as text", code=ErrorCode.INVALID_ARGUMENTS)
        return text + note

    registry.register(web_browse)
    if kit.config.web_search is not None:
        provider = search_provider(kit.config.web_search, kit=kit)

        @tool(name="web_search", description=catalogue_description("web_search"))
        async def web_search(
            query: Annotated[str, Field(min_length=1, description="What to search for.")],
            count: Annotated[int, Field(ge=1, le=20, description="How many results (1-20).")] = 5,
        ) -> str:
            results = await provider.search(session=await kit.http(), query=query, count=count)
            if not results:
                return f"No results for {query!r}."
            return "\n".join(
                f"{n}. [{r.title}]({r.url}) — {r.snippet}".rstrip(" —") for n, r in enumerate(results, 1)
            )

        registry.register(web_search)
    kit.guides.add(GUIDE)
