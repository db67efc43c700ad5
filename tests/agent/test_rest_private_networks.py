"""Issue 31 (Tool authors are tenants): a REST Tool reaches a non-public address only in the networks a cluster
administrator opened (the operator's `private_networks`), checked where the agent connects, redirects included;
`rockbot local` (no such setting) leaves it to the person running it."""

from __future__ import annotations

import ipaddress

from aiohttp import web

from rockbot.contracts.errors import ErrorCode
from tests.agent.configs import agent_config
from tests.agent.test_web_rest import rest, run_tool, serving, site  # noqa: F401 (the site fixture)


async def test_a_rest_tool_reaches_a_private_address_only_where_a_cluster_administrator_opened_it(
        site, scripted_llm) -> None:  # noqa: F811
    tool = rest("status", site.url + "/api/status")
    for networks, reached in ((None, True), ([ipaddress.ip_network("127.0.0.0/8")], True), ([], False),
                              ([ipaddress.ip_network("10.0.0.0/8")], False)):
        config = agent_config(llm_url=scripted_llm.url, tools=[tool]).model_copy(update={"private_networks": networks})
        outcome = await run_tool(config, "status", {})
        if reached:
            assert outcome.error is None and outcome.content == '{"ok": true}', (networks, outcome)
        else:
            assert outcome.error is not None and outcome.error.code == ErrorCode.REJECTED, (networks, outcome)
            assert "leads to 127.0.0.1, a loopback address" in outcome.error.message
            assert "agents.privateNetworks" in outcome.error.message
    assert len(site.requests) == 2  # the refused calls never reached the server


async def test_a_redirect_cannot_take_a_rest_tool_where_it_may_not_go(site, scripted_llm) -> None:  # noqa: F811
    reached: list[str] = []

    async def secret(request: web.Request) -> web.Response:
        reached.append(request.path)
        return web.Response(text="secret")

    inner = web.Application()
    inner.router.add_get("/secret", secret)
    async with serving(inner, host="127.0.0.2") as inner_url:
        tool = rest("hop", site.url + "/redirect{?to}")
        config = agent_config(llm_url=scripted_llm.url, tools=[tool]).model_copy(
            update={"private_networks": [ipaddress.ip_network("127.0.0.1/32")]})
        outcome = await run_tool(config, "hop", {"to": inner_url + "/secret"})
    assert outcome.error is not None and outcome.error.code == ErrorCode.REJECTED
    assert "leads to 127.0.0.2, a loopback address" in outcome.error.message and reached == []
