"""`rockbot local`'s console in a real browser (Debian's chromium): a script's chart shows inline on the run page,
a file that claims to be a PNG but holds HTML only downloads, and a file too large for the script's answer (kept by
the scripts-manager in the run store a chunk at a time) downloads whole (issue 35)."""

from __future__ import annotations

import base64

from playwright.async_api import Browser

from tests.console.test_browser import browser, chromium, screenshot  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.local.browsing import chat_ready, console_fixture, downloaded_text, new_page, shown_image
from tests.local.test_local import EXAMPLES
from tests.local.test_local_console import send
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
open(f"{{out}}/big.csv", "w").write("day,n\\n" + "2026-01-01,1\\n" * 450_000)
"""
BIG = b"day,n\n" + b"2026-01-01,1\n" * 450_000  # 5.6 MiB: more than one script answer carries


local_console = console_fixture(lambda _: EXAMPLES / "analyst.yaml")


async def test_a_scripts_chart_shows_inline_on_the_run_page_and_other_files_only_download(
    browser: Browser, local_console: str, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    url = local_console
    page = await new_page(browser, {"width": 1100, "height": 800})
    await page.goto(f"{url}/agents")
    await page.click("text=analyst")
    await page.click("text=Chat with analyst")
    await chat_ready(page)
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": CHARTS})]),
                      Turn(text="Here is the chart."))  # fmt: skip
    await send(page, "chart the sales")

    async def answered() -> None:
        assert "Here is the chart." in await page.locator(".message.from-assistant .text").last.inner_text()

    await eventually(answered, within=60)
    await page.goto(f"{url}/runs")
    await page.locator("table a[href^='/runs/']").first.click()
    # The browser decoded a PNG (1 pixel wide).
    assert await shown_image(page, page.locator("ul.files img"), selector="ul.files img") == ("chart.png", 1)
    await screenshot(page, "run-files")
    links = {await a.inner_text(): await a.get_attribute("href") for a in await page.locator("ul.files a").all()}
    assert set(links) == {"chart.png", "fake.png", "clean.csv", "big.csv"}
    assert await page.locator("ul.files img").count() == 1  # the HTML "PNG" is no image
    answer = await page.request.get(url + links["fake.png"])
    assert answer.headers["content-type"] == "application/octet-stream"
    assert answer.headers["content-disposition"] == "attachment; filename*=UTF-8''fake.png"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert await downloaded_text(page, page.locator("ul.files a:text('clean.csv')")) == "month,revenue\n2026-01,10\n"
    big = await page.request.get(url + links["big.csv"])
    assert big.status == 200 and await big.body() == BIG
    assert await page.title() != "owned"
    await page.context.close()
