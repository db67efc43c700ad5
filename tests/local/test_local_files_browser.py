"""`rockbot local`'s console in a real browser (Debian's chromium): a script's chart shows inline on the run page,
and a file that claims to be a PNG but holds HTML only downloads (issue 35)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser

from tests.console.test_browser import browser, chromium, screenshot  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.local.test_local import EXAMPLES
from tests.local.test_local_console import send
from tests.local.test_terminal import local_console_of
from tests.waiting import eventually

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
CHARTS = f"""
import base64, os
out = os.environ["ROCKBOT_OUTPUT_DIR"]
open(f"{{out}}/chart.png", "wb").write(base64.b64decode("{base64.b64encode(PNG).decode()}"))
open(f"{{out}}/fake.png", "w").write("<html><script>document.title='owned'</script></html>")
open(f"{{out}}/clean.csv", "w").write("month,revenue\\n2026-01,10\\n")
"""


@pytest.fixture
async def local_console(scripted_llm: ScriptedLLM, tmp_path: Path) -> AsyncIterator[str]:
    async with local_console_of(scripted_llm, EXAMPLES / "analyst.yaml", tmp_path / "runs.db") as (url, _):
        yield url


async def test_a_scripts_chart_shows_inline_on_the_run_page_and_other_files_only_download(
    browser: Browser, local_console: str, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    url = local_console
    page = await (await browser.new_context(viewport={"width": 1100, "height": 800})).new_page()
    await page.goto(f"{url}/agents")
    await page.click("text=analyst")
    await page.click("text=Chat with analyst")
    await page.wait_for_selector("#chat-form[data-ready]", timeout=10_000)
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": CHARTS})]),
                      Turn(text="Here is the chart."))  # fmt: skip
    await send(page, "chart the sales")

    async def answered() -> None:
        assert "Here is the chart." in await page.locator(".message.from-assistant .text").last.inner_text()

    await eventually(answered, within=60)
    await page.goto(f"{url}/runs")
    await page.locator("table a[href^='/runs/']").first.click()
    image = page.locator("ul.files img")
    await image.wait_for(timeout=10_000)
    assert await image.get_attribute("alt") == "chart.png"
    # The page is there before its image: wait for the browser to have loaded it, then see that it decoded a PNG.
    await page.wait_for_function("() => document.querySelector('ul.files img').complete", timeout=10_000)
    assert await image.evaluate("img => img.naturalWidth") == 1
    await screenshot(page, "run-files")
    links = {await a.inner_text(): await a.get_attribute("href") for a in await page.locator("ul.files a").all()}
    assert set(links) == {"chart.png", "fake.png", "clean.csv"}
    assert await page.locator("ul.files img").count() == 1  # the HTML "PNG" is no image
    answer = await page.request.get(url + links["fake.png"])
    assert answer.headers["content-type"] == "application/octet-stream"
    assert answer.headers["content-disposition"] == "attachment; filename*=UTF-8''fake.png"
    assert answer.headers["x-content-type-options"] == "nosniff"
    async with page.expect_download() as download:
        await page.click("ul.files a:text('clean.csv')")
    saved = await (await download.value).path()
    assert await asyncio.to_thread(Path(saved).read_text) == "month,revenue\n2026-01,10\n"
    assert await page.title() != "owned"
    await page.context.close()
