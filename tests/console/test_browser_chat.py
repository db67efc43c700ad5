"""Chat in a real browser (Debian's chromium): a person allowed `create agents/chat` (RBAC on the real API server)
chats with an agent process over a real RabbitMQ, sees the answer stream in and a tool-call card, comes back to the
conversation, starts a new one; a person without the right gets 403, and a POST without the CSRF token is refused.
Screenshots in test-artifacts/console/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import Browser, Page

from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import AccessReviewer
from rockbot.console.store_models import RunFilter
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.kube import AGENTS, KubeClient
from tests.agent.configs import agent_config
from tests.console.chat_world import ChatWorld, chat_world
from tests.console.conftest import Rbac, agent_body, service_account_token
from tests.console.test_browser import VIEW, browser, chromium, log_in, screenshot  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

CHATTER = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}, " \
          "{apiGroups: [rockbot.dev], resources: [agents/chat], verbs: [create]}]"
ANSWER = "Streaming <b>this</b> answer <script>alert('owned')</script> in pieces."


@dataclass(kw_only=True)
class Site:
    url: str
    namespace: str
    world: ChatWorld


@pytest.fixture
async def site(kube_admin: KubeClient, namespaces: list[str], scripted_llm: ScriptedLLM, vhost: Vhost,
               tmp_path: Path) -> AsyncIterator[Site]:
    mine = namespaces[0]
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="helper"))
    config = agent_config(llm_url=scripted_llm.url, name="helper", namespace=mine, builtin_tools=["guides"])
    async with chat_world(config, vhost=vhost, folder=tmp_path) as world:
        gate = Gate(tokens=TokenReviewer(kube=kube_admin, ttl=0), sessions=Sessions())
        app = build_app(gate=gate, authorizer=AccessReviewer(kube=kube_admin, ttl=0), kube=kube_admin,
                        store=world.store, chat=world.relay)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            yield Site(url=f"http://127.0.0.1:{runner.addresses[0][1]}", namespace=mine, world=world)
        finally:
            await runner.cleanup()


async def person(browser: Browser, site: Site, kube_admin: KubeClient, *, name: str) -> Page:  # noqa: F811
    token = await service_account_token(kube_admin, namespace=site.namespace, name=name)
    page = await (await browser.new_context(viewport={"width": 1100, "height": 800})).new_page()
    await log_in(page, site.url, token)
    return page


async def test_a_person_chats_in_the_browser_and_watches_text_and_tools_stream(
    rbac: Rbac, browser: Browser, site: Site, kube_admin: KubeClient, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    rbac.grant(namespace=site.namespace, user=f"system:serviceaccount:{site.namespace}:alice", rules=CHATTER,
               name="chatter")
    page = await person(browser, site, kube_admin, name="alice")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await page.goto(f"{site.url}/agents/{site.namespace}/helper")
    await page.click("text=Chat with helper")
    await page.wait_for_selector("#chat-form[data-ready]", timeout=10_000)
    first_session = page.url.split("session=")[1]

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="list_tool_guides")]), Turn(text=ANSWER, hold_after_chars=8))
    await page.fill("textarea[name=message]", "Which guides are there?")
    await page.click("#chat-form button[type=submit]")
    card = page.locator(".message.from-assistant .tool-card")
    await card.wait_for(timeout=30_000)
    assert await card.locator(".tool-name").inner_text() == "list_tool_guides"
    answer = page.locator(".message.from-assistant .text")

    async def partly_streamed() -> None:  # the model holds the rest until released: what shows came streamed
        shown = await answer.inner_text()
        assert shown and ANSWER.startswith(shown) and shown != ANSWER, shown

    await eventually(partly_streamed, within=30)
    await screenshot(page, "chat-streaming")
    scripted_llm.release.set()

    async def answered() -> None:
        assert await answer.inner_text() == ANSWER  # the model's HTML is text
        assert await page.locator("#chat-form[data-busy]").count() == 0

    await eventually(answered, within=30)
    assert "done" in (await card.get_attribute("class") or "")
    assert await page.locator(".message b, .message script").count() == 0 and dialogs == []
    await screenshot(page, "chat")

    async def kept() -> None:  # the run store keeps the conversation: it is there when the page opens again
        runs = await site.world.store.list_runs(filters=RunFilter(namespace=site.namespace, agent="helper"))
        assert [r.outcome for r in runs.runs] == ["Succeeded"]

    await eventually(kept, within=30)
    await page.goto(f"{site.url}/agents/{site.namespace}/helper/chat")  # the latest conversation
    assert page.url.endswith(f"session={first_session}")
    assert await page.locator(".message.from-user").inner_text() == "Which guides are there?"
    assert await page.locator(".message.from-assistant .text").inner_text() == ANSWER

    await page.click("#new-conversation")
    await page.wait_for_selector("#no-messages", timeout=10_000)
    await page.wait_for_selector("#chat-form[data-ready]", timeout=10_000)
    assert page.url.split("session=")[1] != first_session
    assert await page.locator(".message").count() == 0
    await page.context.close()


async def test_without_agents_chat_the_chat_is_refused_and_a_post_needs_the_csrf_token(
    rbac: Rbac, browser: Browser, site: Site, kube_admin: KubeClient, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    rbac.grant(namespace=site.namespace, user=f"system:serviceaccount:{site.namespace}:bob", rules=VIEW,
               name="viewer")
    rbac.grant(namespace=site.namespace, user=f"system:serviceaccount:{site.namespace}:carol", rules=CHATTER,
               name="chatter")
    chat = f"{site.url}/agents/{site.namespace}/helper/chat"
    bob = await person(browser, site, kube_admin, name="bob")
    await bob.goto(f"{site.url}/agents/{site.namespace}/helper")
    assert await bob.locator("text=Chat with helper").count() == 0
    response = await bob.goto(chat)
    assert response is not None and response.status == 403 and "may not create agents/chat" in await bob.content()
    post = await bob.request.post(chat, data={"session": "s1", "message": "hi"}, headers={"X-CSRF-Token": "x"})
    assert post.status == 403

    carol = await person(browser, site, kube_admin, name="carol")
    await carol.goto(chat)
    status = await carol.evaluate("""async () => (await fetch(location.pathname, {method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify({session: "s1", message: "hi"})})).status""")
    assert status == 403  # her own page's fetch, her cookie, but no CSRF token
    assert scripted_llm.requests == []  # nothing reached the agent
    for page in (bob, carol):
        await page.context.close()
