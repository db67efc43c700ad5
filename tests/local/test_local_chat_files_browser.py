"""Issue 35's first "Done when", in a real browser (Debian's chromium) on `rockbot local`: a person attaches a
CSV to a chat turn, the (scripted) model loads it with pandas in one script and charts it with matplotlib in the
next, relying on the conversation's session; the chart shows inline in the chat and on the run page, and the
cleaned CSV downloads. Also what the console refuses: a file over the bound, another conversation's file id, a
guessed one."""

from __future__ import annotations

import secrets
import urllib.parse
from pathlib import Path

from playwright.async_api import Browser

from rockbot.contracts.files import MAX_UPLOAD_BYTES
from tests.console.test_browser import browser, chromium, screenshot  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.local.browsing import chat_ready, console_fixture, downloaded_text, new_page, shown_image
from tests.waiting import eventually

ANALYST = """
apiVersion: rockbot.dev/v1alpha1
kind: Agent
metadata: {name: analyst}
spec:
  model: {baseUrl: "https://llm.example/v1", name: m}
  builtinTools: [scripts]
  scriptLimits: {timeoutSeconds: 60, memory: 1Gi}
  scriptSessions: {mode: PerConversation}
"""
SALES = b"month,revenue\n2026-01,10\n2026-02,\n2026-03,9\n2026-04,15\n"
LOAD = """
import pandas as pd
sales = pd.read_csv("/input/sales.csv").dropna()
sales["revenue"] = sales["revenue"].astype(int)
sales.to_csv("/output/clean.csv", index=False)
print(len(sales), "rows")
"""
CHART = """
import matplotlib.pyplot as plt
sales.plot(x="month", y="revenue", kind="bar", legend=False)
plt.show()
"""
CLEAN = "month,revenue\n2026-01,10\n2026-03,9\n2026-04,15\n"


def _analyst(folder: Path) -> Path:
    (folder / "analyst.yaml").write_text(ANALYST)
    return folder / "analyst.yaml"


analyst_console = console_fixture(_analyst)


async def test_a_person_uploads_a_csv_and_gets_a_chart_inline_and_the_cleaned_csv(
    browser: Browser, analyst_console: str, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    url = analyst_console
    page = await new_page(browser, {"width": 1100, "height": 900})
    await page.goto(f"{url}/agents/local/analyst/chat")
    await chat_ready(page)
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": LOAD})]),
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": CHART})]),
        Turn(text="Here is revenue by month."),
    )
    await page.set_input_files("input[name=files]", files=[{"name": "sales.csv", "mimeType": "text/csv",
                                                            "buffer": SALES}])  # fmt: skip
    await page.fill("textarea[name=message]", "chart revenue by month")
    await page.click("#chat-form button[type=submit]")
    answer = page.locator(".message.from-assistant").last

    async def answered() -> None:
        said = await page.locator("#conversation").inner_text()
        assert "Here is revenue by month." in said, (said, len(scripted_llm.requests))

    await eventually(answered, within=120)
    # The model read the attachment's name, type and size with the message; the second script used the first's
    # variables (the session), and each said so.
    told = scripted_llm.requests[0].messages[-1]["content"]
    assert told.startswith("chart revenue by month\n\n[attached, read-only for scripts under /input: sales.csv "
                           f"(text/csv, {len(SALES)} bytes)]"), told  # fmt: skip
    first, second = (request.messages[-1]["content"] for request in scripted_llm.requests[1:3])
    assert "3 rows" in first and "clean.csv (text/csv" in first, first
    assert "exit code 0" in second and "same session" in second and "figure-1.png (image/png" in second, second
    assert await page.locator(".message.from-user ul.files a").all_inner_texts() == ["sales.csv"]
    # The chart inline in the chat, decoded as an image; the cleaned CSV a download.
    alt, width = await shown_image(page, answer.locator("ul.files img"), selector=".from-assistant ul.files img")
    assert alt == "figure-1.png" and width > 100, (alt, width)
    await screenshot(page, "chat-files")
    assert await downloaded_text(page, answer.locator("ul.files a:text('clean.csv')")) == CLEAN
    # The run page shows the same chart inline, and the person's attachment among the run's files.
    await answer.locator("a.run-link").click()
    alt, width = await shown_image(page, page.locator("ul.files img"), selector="ul.files img")
    assert alt == "figure-1.png" and width > 100, (alt, width)
    names = set(await page.locator("ul.files a").all_inner_texts())
    assert names == {"sales.csv", "clean.csv", "figure-1.png"}, names
    await screenshot(page, "chat-files-run")
    # Reopened, the conversation lists its files.
    await page.go_back()
    await page.reload()
    assert set(await page.locator(".conversation-files ul.files a").all_text_contents()) == names
    await page.context.close()


async def test_uploads_are_bounded_and_a_turn_takes_only_its_own_conversations_files(
    browser: Browser, analyst_console: str, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    url = analyst_console
    page = await new_page(browser)
    await page.goto(f"{url}/agents/local/analyst/chat?session=one")
    csrf = await page.locator("#chat-form input[name=csrf]").input_value()
    chat = f"{url}/agents/local/analyst/chat"

    async def upload(session: str, name: str, body: bytes) -> object:
        return await page.request.post(f"{chat}/files?session={session}", data=body, headers={
            "X-CSRF-Token": csrf, "X-File-Name": urllib.parse.quote(name)})

    too_large = await upload("one", "big.bin", b"x" * (MAX_UPLOAD_BYTES + 1))
    assert too_large.status == 413 and "at most 10,485,760 bytes" in await too_large.text()
    bad_name = await upload("one", "../etc/passwd", b"x")
    assert bad_name.status == 400 and "X-File-Name" in await bad_name.text()
    others = await (await upload("two", "theirs.csv", b"a\n")).json()  # another conversation's file

    async def turn(file_id: str) -> tuple[int, str]:
        answer = await page.request.post(chat, headers={"X-CSRF-Token": csrf}, data={
            "session": "one", "message": "use it", "files": [file_id]})
        return answer.status, await answer.text()

    guessed = await turn("f" + secrets.token_hex(16))
    assert guessed == (400, "files[0]: no such file in this conversation")
    assert await turn(others["id"]) == guessed  # refused exactly as an id nobody holds
    assert not scripted_llm.requests  # nothing reached the model
    await page.context.close()
