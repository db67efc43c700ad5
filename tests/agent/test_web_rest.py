"""web_browse, web_search and REST tools against local HTTP servers (never the internet)."""

from __future__ import annotations

import ipaddress
import json

import pytest
from aiohttp import web

from rockbot.agent.egress import AddressRefused, EgressPolicy
from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.toolsets.web import html_to_markdown
from rockbot.contracts.agent_config import FunctionDefinition, ResolvedTool, RestBackend, ToolDefinition
from tests.agent.configs import agent_config
from tests.fixtures.serving import serving

CONTEXT = ToolContext(session_id="s", tool_call_id="c1")
PAGE = """<html><head><title>Rock facts</title><style>body{color:red}</style><script>alert(1)</script></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<main><h1>Granite</h1><p>Granite is an <b>igneous</b> rock.</p><h2>Uses</h2><ul><li>Counters</li><li>Kerbs</li></ul>
<p>See <a href="https://example.org/granite">more</a>.</p></main>
<footer>Copyright 2026 Rocks Inc</footer></body></html>"""


@pytest.fixture
async def site():
    """A local HTTP server recording what it was asked; tests add routes before the first request."""
    seen: list[dict] = []
    hits: list[str] = []

    @web.middleware
    async def record(request, handler):
        hits.append(request.path_qs)
        return await handler(request)

    app = web.Application(middlewares=[record])

    async def page(request):
        return web.Response(text=PAGE, content_type="text/html")

    async def binary(request):
        return web.Response(body=b"\x89PNG", content_type="image/png")

    async def missing(request):
        return web.Response(status=404, text="gone")

    async def searxng(request):
        seen.append({"path": request.path, "query": dict(request.query)})
        return web.json_response({"results": [
            {"title": "Granite - Wiki", "url": "https://example.org/granite", "content": "An igneous rock."},
            {"title": "Basalt", "url": "https://example.org/basalt", "content": "Volcanic."},
        ]})

    async def brave(request):
        seen.append({"path": request.path, "query": dict(request.query),
                     "token": request.headers.get("X-Subscription-Token")})
        return web.json_response({"web": {"results": [
            {"title": "Granite", "url": "https://example.org/granite", "description": "Rock."}]}})

    async def echo(request):
        body = await request.text()
        seen.append({"method": request.method, "raw_path": request.raw_path, "path": request.path,
                     "query": dict(request.query), "body": json.loads(body) if body else None,
                     "auth": request.headers.get("Authorization"), "key": request.headers.get("X-Api-Key"),
                     "extra": request.headers.get("X-Team")})
        return web.json_response({"ok": True})

    async def flaky(request):
        return web.Response(status=503, text="maintenance")

    app.router.add_get("/page", page)
    app.router.add_get("/logo.png", binary)
    app.router.add_get("/missing", missing)
    app.router.add_get("/search", searxng)
    app.router.add_get("/brave", brave)
    app.router.add_route("*", "/api/{tail:.*}", echo)
    async def redirect(request):
        raise web.HTTPFound(request.query["to"])

    app.router.add_get("/flaky", flaky)
    app.router.add_get("/redirect", redirect)
    async with serving(app, host="127.0.0.1") as base_url:

        class Site:
            url = base_url
            requests = seen
            paths = hits  # every request the server saw, whatever the route

        yield Site


def test_html_becomes_markdown_without_noise():
    markdown = html_to_markdown(PAGE)
    assert markdown.startswith("# Granite")
    assert "Granite is an **igneous** rock." in markdown and "## Uses" in markdown
    assert "* Counters" in markdown and "[more](https://example.org/granite)" in markdown
    for noise in ("alert(1)", "color:red", "Home", "Copyright"):
        assert noise not in markdown


async def run_tool(config, name, arguments, env=None):
    async with AgentRuntime.from_config(config, env=env or {}) as agent:
        return await agent.registry.invoke(name, arguments, context=CONTEXT)


def browsing_config(llm_url, *, allowed_networks=("127.0.0.1/32",), **fields):
    """The web set with loopback 127.0.0.1 opted in (the test servers live there); nothing else allowed."""
    return agent_config(llm_url=llm_url, builtin_tools=["web"],
                        web_browse={"allowed_networks": list(allowed_networks)}, **fields)


async def test_web_browse_fetches_a_local_page_as_markdown(site, scripted_llm):
    outcome = await run_tool(browsing_config(scripted_llm.url), "web_browse", {"url": f"{site.url}/page"})
    assert outcome.ok and outcome.content.startswith("# Granite") and "Copyright" not in outcome.content


async def test_web_browse_follows_a_redirect_within_allowed_networks(site, scripted_llm):
    outcome = await run_tool(browsing_config(scripted_llm.url), "web_browse",
                             {"url": f"{site.url}/redirect?to={site.url}/page"})
    assert outcome.ok and outcome.content.startswith("# Granite")
    assert site.paths == [f"/redirect?to={site.url}/page", "/page"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_web_browse_refuses_loopback_by_default_without_connecting(site, scripted_llm, host):
    url = site.url.replace("127.0.0.1", host) + "/page"
    outcome = await run_tool(agent_config(llm_url=scripted_llm.url, builtin_tools=["web"]), "web_browse", {"url": url})
    assert outcome.error.code == "Rejected" and not outcome.error.retryable
    assert ", a loopback address" in outcome.error.message  # localhost may resolve to ::1 first
    assert "web_browse.allowed_networks" in outcome.error.message
    assert site.paths == []


async def test_web_browse_names_the_refused_address_and_the_setting_to_allow_it(site, scripted_llm):
    outcome = await run_tool(browsing_config(scripted_llm.url, allowed_networks=[]), "web_browse",
                             {"url": f"{site.url}/page"})
    assert outcome.error.message == (
        f"web_browse refused {site.url}/page: it (or a redirect from it) leads to 127.0.0.1, a loopback address, "
        "which is not on the public internet; to let this agent reach it, add its network to "
        "web_browse.allowed_networks in the agent config (e.g. 127.0.0.1/32)")


async def test_web_browse_refuses_loopback_when_the_allowed_networks_exclude_it(site, scripted_llm):
    """Opening private ranges opens only them: loopback stays refused, and the server sees nothing."""
    config = browsing_config(scripted_llm.url, allowed_networks=["10.0.0.0/8", "192.168.0.0/16", "fd00::/8"])
    outcome = await run_tool(config, "web_browse", {"url": f"{site.url}/page"})
    assert outcome.error.code == "Rejected" and "leads to 127.0.0.1, a loopback address" in outcome.error.message
    assert site.paths == []


async def test_web_browse_checks_every_redirect_hop(site, scripted_llm):
    """127.0.0.1 is opted in, 127.0.0.2 (another loopback address, with its own server) is not."""
    other_paths: list[str] = []

    async def other_page(request):
        other_paths.append(request.path)
        return web.Response(text="internal", content_type="text/plain")

    other = web.Application()
    other.router.add_get("/internal", other_page)
    async with serving(other, host="127.0.0.2") as other_url:
        config = browsing_config(scripted_llm.url)
        direct = await run_tool(config, "web_browse", {"url": f"{other_url}/internal"})
        via_redirect = await run_tool(config, "web_browse", {"url": f"{site.url}/redirect?to={other_url}/internal"})
    assert direct.error.code == via_redirect.error.code == "Rejected"
    assert "leads to 127.0.0.2, a loopback address" in via_redirect.error.message
    assert "127.0.0.2/32" in via_redirect.error.message
    assert other_paths == [] and len(site.paths) == 1


async def test_web_browse_with_every_network_allowed_reaches_loopback(site, scripted_llm):
    config = browsing_config(scripted_llm.url, allowed_networks=["0.0.0.0/0", "::/0"])
    outcome = await run_tool(config, "web_browse", {"url": site.url.replace("127.0.0.1", "localhost") + "/page"})
    assert outcome.ok and site.paths == ["/page"]


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "a loopback address"), ("::1", "a loopback address"), ("::ffff:127.0.0.1", "a loopback address"),
    ("10.1.2.3", "a private address"), ("172.16.0.1", "a private address"), ("192.168.1.1", "a private address"),
    ("fd12::1", "a private address"), ("169.254.169.254", "a link-local address"),
    ("fe80::1%2", "a link-local address"),
    ("0.0.0.0", "an unspecified address"), ("::", "an unspecified address"), ("224.0.0.1", "a multicast address"),
    ("ff02::1", "a multicast address"), ("240.0.0.1", "a private address"), ("100.64.0.1", "a special-purpose address"),
])
def test_non_public_addresses_are_refused(address, reason):
    with pytest.raises(AddressRefused) as refused:
        EgressPolicy().check(address)
    assert refused.value.reason == reason


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address):
    EgressPolicy().check(address)  # no exception; no connection is made by check()


def test_allowed_networks_open_only_themselves():
    policy = EgressPolicy(allowed_networks=[ipaddress.ip_network("10.20.0.0/16")])
    policy.check("10.20.3.4")
    with pytest.raises(AddressRefused):
        policy.check("10.21.0.1")


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"])
def test_the_cloud_metadata_endpoint_is_refused_even_with_private_ranges_and_loopback_open(address):
    """Decided from the address alone (tests never send anything there)."""
    policy = EgressPolicy(allowed_networks=[ipaddress.ip_network(n) for n in (
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "::1/128")])
    with pytest.raises(AddressRefused) as refused:
        policy.check(address)
    assert refused.value.reason in ("a link-local address", "a private address")


def test_the_metadata_endpoint_is_reachable_only_when_its_own_network_is_listed():
    EgressPolicy(allowed_networks=[ipaddress.ip_network("169.254.169.254/32")]).check("169.254.169.254")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "javascript:alert(1)", "/relative"])
async def test_web_browse_refuses_urls_that_are_not_http(scripted_llm, url):
    outcome = await run_tool(agent_config(llm_url=scripted_llm.url, builtin_tools=["web"]), "web_browse", {"url": url})
    assert outcome.error.code == "InvalidArguments" and "only fetches absolute http(s) URLs" in outcome.error.message


async def test_web_browse_reports_http_errors_and_binary_content(site, scripted_llm):
    config = browsing_config(scripted_llm.url)
    missing = await run_tool(config, "web_browse", {"url": f"{site.url}/missing"})
    binary = await run_tool(config, "web_browse", {"url": f"{site.url}/logo.png"})
    assert missing.error.code == "ExecutionFailed" and "HTTP 404" in missing.error.message
    assert binary.error.code == "InvalidArguments" and "image/png" in binary.error.message


async def test_web_search_with_searxng(site, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["web"],
                          web_search={"provider": "searxng", "url": site.url})
    outcome = await run_tool(config, "web_search", {"query": "granite rock", "count": 1})
    assert outcome.content == "1. [Granite - Wiki](https://example.org/granite) — An igneous rock."
    assert site.requests == [{"path": "/search", "query": {"q": "granite rock", "format": "json"}}]


async def test_web_search_with_brave_sends_the_key_from_env(site, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["web"], web_search={
        "provider": "brave", "url": f"{site.url}/brave", "api_key": {"env": "BRAVE_KEY"}})
    outcome = await run_tool(config, "web_search", {"query": "granite"}, env={"BRAVE_KEY": "brave-secret"})
    assert outcome.content == "1. [Granite](https://example.org/granite) — Rock."
    assert site.requests == [{"path": "/brave", "query": {"q": "granite", "count": "5"}, "token": "brave-secret"}]


async def test_brave_without_a_key_is_a_clear_startup_error(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["web"],
                          web_search={"provider": "brave", "api_key": {"env": "BRAVE_KEY"}})
    with pytest.raises(ValueError, match=r"web_search\.api_key: .*BRAVE_KEY"):
        async with AgentRuntime.from_config(config, env={}):
            pass


def rest(name, url, *, method="GET", auth=None, headers=None, parameters=None):
    return ResolvedTool(
        definition=ToolDefinition(function=FunctionDefinition(
            name=name, description=f"{method} {url}", parameters=parameters or {"type": "object"})),
        source=f"tool:{name}",
        backend=RestBackend(url=url, method=method, auth=auth, headers=headers or {}),
    )


async def test_rest_get_expands_the_template_with_escaping(site, scripted_llm):
    tool = rest("city_weather", site.url + "/api/cities/{city}/weather{?units}")
    outcome = await run_tool(agent_config(llm_url=scripted_llm.url, tools=[tool]), "city_weather",
                             {"city": "São Paulo/../admin?x=1#f", "units": "metric", "days": 3})
    assert outcome.content == '{"ok": true}'
    [seen] = site.requests
    assert seen["raw_path"].startswith("/api/cities/S%C3%A3o%20Paulo%2F..%2Fadmin%3Fx%3D1%23f/weather?")
    assert seen["query"] == {"units": "metric", "days": "3"} and seen["method"] == "GET"


async def test_rest_post_sends_the_remaining_arguments_as_json_with_bearer_auth(site, scripted_llm):
    tool = rest("create_ticket", site.url + "/api/projects/{project}/tickets", method="POST", headers={"X-Team": "a"},
                auth={"type": "bearer", "value": {"env": "TICKETS_TOKEN"}})
    outcome = await run_tool(agent_config(llm_url=scripted_llm.url, tools=[tool]), "create_ticket",
                             {"project": "rocks", "title": "Crack", "labels": ["geo"]}, env={"TICKETS_TOKEN": "tkn"})
    assert outcome.ok
    assert site.requests == [{"method": "POST", "raw_path": "/api/projects/rocks/tickets", "path":
                              "/api/projects/rocks/tickets", "query": {}, "body": {"title": "Crack", "labels": ["geo"]},
                              "auth": "Bearer tkn", "key": None, "extra": "a"}]


async def test_rest_api_key_header_and_missing_secret(site, scripted_llm):
    tool = rest("lookup", site.url + "/api/x", method="PUT",
                auth={"type": "header", "header_name": "X-Api-Key", "value": {"env": "LOOKUP_KEY"}})
    config = agent_config(llm_url=scripted_llm.url, tools=[tool])
    ok = await run_tool(config, "lookup", {"a": 1}, env={"LOOKUP_KEY": "k1"})
    missing = await run_tool(config, "lookup", {"a": 1}, env={})
    assert ok.ok and site.requests[0]["key"] == "k1" and site.requests[0]["method"] == "PUT"
    assert missing.error.code == "Unavailable" and "LOOKUP_KEY" in missing.error.message and len(site.requests) == 1


async def test_rest_errors_come_back_as_data(site, scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, tools=[rest("flaky", site.url + "/flaky"),
                                                           rest("nowhere", "http://127.0.0.1:9/x")])
    flaky = await run_tool(config, "flaky", {})
    nowhere = await run_tool(config, "nowhere", {})
    assert (flaky.error.code, flaky.error.retryable) == ("Unavailable", True) and "HTTP 503" in flaky.error.message
    assert (nowhere.error.code, nowhere.error.retryable) == ("Unavailable", True)
