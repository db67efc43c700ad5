"""`rockbot local` serves the console on 127.0.0.1 with no login: in a real browser (Debian's chromium) a person
chats with the example analyst, whose `execute_python_script` (the local sandbox) needs approval; approved in the
console, the script runs (it writes a file and reads it back); denied, it never runs (the run records no script
run, the model gets the refusal). Another host name is refused. Screenshots in test-artifacts/console/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import Browser, Page

from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from tests.console.test_browser import browser, chromium, screenshot  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.local.test_approvals_local import analyst_needing_approval  # noqa: F401 (fixture)
from tests.local.test_terminal import Chat, local_console_of
from tests.waiting import eventually

#: What the approved script does: write a file (in its sandbox's /tmp), read it back.
WRITES = "open('/tmp/proof.txt', 'w').write(str(6 * 7))\nprint('proof says', open('/tmp/proof.txt').read())\n"


@pytest.fixture
async def local_console(scripted_llm: ScriptedLLM, analyst_needing_approval: Path,  # noqa: F811
                        tmp_path: Path) -> AsyncIterator[tuple[str, Path, Chat]]:
    """`rockbot local` with its console on a free port: (the console's URL, the run store's file, its terminal)."""
    async with local_console_of(scripted_llm, analyst_needing_approval, tmp_path / "runs.db") as (url, chat):
        yield url, tmp_path / "runs.db", chat


async def send(page: Page, text: str) -> None:
    await page.fill("textarea[name=message]", text)
    await page.click("#chat-form button[type=submit]")


async def decide(browser: Browser, url: str, *, button: str, reason: str, shot: str) -> None:  # noqa: F811
    page = await (await browser.new_context()).new_page()
    await page.goto(f"{url}/approvals")
    await page.wait_for_selector("section.approval", timeout=30_000)
    await screenshot(page, shot)
    await page.fill("input[name=reason]", reason)
    await page.click(f"button[value={button}]")
    await page.wait_for_url(f"{url}/approvals", timeout=10_000)
    await page.context.close()


async def test_local_console_chats_and_a_person_approves_then_denies_a_sandboxed_script(
    browser: Browser, local_console: tuple[str, Path, Chat], scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    url, runs, _ = local_console
    page = await (await browser.new_context(viewport={"width": 1100, "height": 800})).new_page()
    await page.goto(f"{url}/agents")  # no login page: whoever reaches 127.0.0.1 is the person at the machine
    assert "analyst" in await page.locator("table.agents").inner_text()
    await page.click("text=analyst")
    await page.click("text=Chat with analyst")
    await page.wait_for_selector("#chat-form[data-ready]", timeout=10_000)

    call = ScriptedCall(name="execute_python_script", arguments={"script": WRITES})
    scripted_llm.play(Turn(tool_calls=[call]), Turn(text="The file says 42."))
    await send(page, "write the proof")
    card = page.locator(".message.from-assistant .tool-card").last
    await eventually(lambda: _has(card, "waiting for a person's approval"), within=30)
    await decide(browser, url, button="approve", reason="it only writes /tmp", shot="local-approvals")
    await eventually(lambda: _has(page.locator(".message.from-assistant .text").last, "The file says 42."), within=30)
    assert "done" in (await card.get_attribute("class") or "")
    assert "proof says 42" in scripted_llm.requests[1].messages[-1]["content"]  # it ran: the file was written
    await screenshot(page, "local-chat")

    scripted_llm.play(Turn(tool_calls=[call]), Turn(text="I was not allowed to."))
    await send(page, "write it again")
    card = page.locator(".message.from-assistant .tool-card").last
    await eventually(lambda: _has(card, "waiting for a person's approval"), within=30)
    await decide(browser, url, button="deny", reason="not twice", shot="local-approvals-deny")
    await eventually(lambda: _has(card, "denied this call of execute_python_script"), within=30)
    await eventually(lambda: _has(page.locator(".message.from-assistant .text").last, "I was not allowed"), within=30)
    assert "Rejected" in scripted_llm.requests[3].messages[-1]["content"]
    await page.context.close()

    store = await Store.open(url=f"sqlite:///{runs}")
    try:
        listed = (await store.list_runs(filters=RunFilter(agent="analyst"))).runs
        denied, approved = [await store.get_run(run.run_id) for run in listed]  # newest first
    finally:
        await store.close()
    assert approved is not None and denied is not None and approved.caller.startswith("console:local:")
    [script] = [e for e in approved.timeline if e.kind == "script_run"]
    assert "proof says 42" in str(script.data)
    assert not [e for e in denied.timeline if e.kind == "script_run"]  # denied: the sandbox never ran it
    statuses = {e.status for e in denied.timeline if e.kind in ("approval", "tool_call")}
    assert {"Denied", "Rejected"} <= statuses, statuses

    async with aiohttp.ClientSession() as http, http.get(f"{url}/agents", headers={"Host": "evil.example"}) as answer:
        assert answer.status == 421  # a page that rebinds its own name to 127.0.0.1 is not served


async def test_a_call_of_a_terminal_turn_asks_at_the_terminal_and_the_console_answers_first(
    browser: Browser, local_console: tuple[str, Path, Chat], scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    url, _, terminal = local_console
    call = ScriptedCall(name="execute_python_script", arguments={"script": WRITES})
    scripted_llm.play(Turn(tool_calls=[call]), Turn(text="Written."))
    terminal.process.stdin.write(b"write the proof\n")
    await terminal.wait_for("analyst wants to run execute_python_script", seconds=60)  # asked at the terminal ...
    await decide(browser, url, button="approve", reason="from the browser", shot="local-approvals-terminal")
    await terminal.wait_for("(approved in the console by local:", seconds=30)  # ... answered in the console
    await terminal.wait_for("[tools called: execute_python_script]", seconds=60)
    assert "proof says 42" in scripted_llm.requests[1].messages[-1]["content"]


async def _has(locator, text: str) -> None:
    shown = await locator.inner_text()
    assert text in shown, shown
