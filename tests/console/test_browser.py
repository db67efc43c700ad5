"""The console in a real browser (Debian's chromium, headless, driven by Playwright): log in with a
ServiceAccount token against the real API server, see only what RBAC allows, hostile text stays text, a
cross-site form cannot act. Screenshots of each page are kept in test-artifacts/console/."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from rockbot.console.auth_sessions import COOKIE_NAME
from rockbot.kube import AGENTS, KubeClient
from tests.console.conftest import REPOSITORY, Console, Rbac, agent_body, service_account_token

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("ROCKBOT_TEST_ARTIFACTS", REPOSITORY / "test-artifacts")) / "console"
VIEW = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}]"
HOSTILE = '<script>alert("owned")</script><b>bold?</b>'


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/setup (it installs Debian's chromium)")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            yield launched
        finally:
            await launched.close()


#: Shots the documentation shows, by the name of their picture in docs/images: every run writes them anew, so a
#: picture of the console is never older than the last run of its test.
DOCUMENTED = {"approvals": "console-approvals", "run": "console-run", "chat": "console-chat",
              "local-chat": "console-local-chat", "memories": "console-memories", "run-replay": "console-replay",
              "chat-files": "console-chat-files"}
DOCS_IMAGES = REPOSITORY / "docs" / "images"


async def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    picture = await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    if name in DOCUMENTED:
        (DOCS_IMAGES / f"{DOCUMENTED[name]}.png").write_bytes(picture)


async def log_in(page: Page, url: str, token: str) -> None:
    await page.goto(f"{url}/agents")
    assert page.url == f"{url}/login"
    await screenshot(page, "login")
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{url}/agents", timeout=10_000)


async def test_a_user_logs_in_and_sees_only_their_namespace(
    rbac: Rbac, browser: Browser, console: Console, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine, other = namespaces
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="helper", description=HOSTILE))
    await kube_admin.create(AGENTS, body=agent_body(namespace=other, name="elsewhere"))
    token = await service_account_token(kube_admin, namespace=mine, name="alice")
    rbac.grant(namespace=mine, user=f"system:serviceaccount:{mine}:alice", rules=VIEW, name="console-viewer")
    context = await browser.new_context()
    page = await context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await log_in(page, console.url, token)
    rows = await page.locator("table.agents tbody tr").all_inner_texts()
    assert len(rows) == 1 and "helper" in rows[0] and mine in rows[0]
    assert other not in await page.content()
    await screenshot(page, "agents")
    (cookie,) = [c for c in await context.cookies() if c["name"] == COOKIE_NAME]
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"

    await page.click("text=helper")
    await page.wait_for_url(f"{console.url}/agents/{mine}/helper", timeout=10_000)
    assert await page.locator("p.description").inner_text() == HOSTILE  # shown as the text it is
    assert await page.locator("p.description b").count() == 0
    await screenshot(page, "agent")
    assert dialogs == []  # no script of the agent's ran

    await page.goto(f"{console.url}/agents/{other}/elsewhere")
    assert "may not get agents" in await page.content()
    await context.close()


async def test_a_cross_site_form_cannot_log_the_user_out(
    browser: Browser, console: Console, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    token = await service_account_token(kube_admin, namespace=namespaces[0], name="alice")
    posted: list[int] = []

    async def evil(request: web.Request) -> web.Response:  # another site: localhost is not 127.0.0.1
        return web.Response(content_type="text/html", text=f"""<form id=f method=post action="{console.url}/logout">
            <input name=csrf value=guess></form><script>document.getElementById('f').submit()</script>""")

    runner = web.AppRunner(web.Application())
    runner.app.router.add_get("/", evil)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    context = await browser.new_context()
    page = await context.new_page()
    page.on("response", lambda response: posted.append(response.status) if response.url.endswith("/logout") else None)
    try:
        await log_in(page, console.url, token)
        await page.goto(f"http://localhost:{runner.addresses[0][1]}/")
        await page.wait_for_load_state("networkidle", timeout=10_000)
        assert posted and posted[0] in (401, 403), posted  # refused (and, SameSite=Strict, sent without the cookie)
        await page.goto(f"{console.url}/agents")
        assert page.url == f"{console.url}/agents"  # still logged in
    finally:
        await context.close()
        await runner.cleanup()
