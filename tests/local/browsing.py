"""Steps the browser tests of `rockbot local`'s console share: the console of one Agent file, a page, a chat ready
for input, an image shown inline (loaded and decoded), a file downloaded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Locator, Page, ViewportSize

from tests.fixtures.llm import ScriptedLLM
from tests.local.test_terminal import local_console_of


def console_fixture(manifest: Callable[[Path], Path]) -> Any:
    """A fixture: `rockbot local` running the manifest file `manifest(tmp_path)` gives (its runs in `tmp_path`) with
    the scripted model; its console's URL."""

    @pytest.fixture
    async def console(scripted_llm: ScriptedLLM, tmp_path: Path) -> AsyncIterator[str]:
        async with local_console_of(scripted_llm, manifest(tmp_path), tmp_path / "runs.db") as (url, _):
            yield url

    return console


async def new_page(browser: Browser, viewport: ViewportSize | None = None) -> Page:
    """A page in a context of its own (`page.context.close()` ends both)."""
    return await (await browser.new_context(viewport=viewport)).new_page()


async def chat_ready(page: Page) -> None:
    """Wait for the chat page's script to have set up its form (before, a submit would post the page itself)."""
    await page.wait_for_selector("#chat-form[data-ready]", timeout=10_000)


async def shown_image(page: Page, image: Locator, *, selector: str) -> tuple[str | None, int]:
    """The `alt` and natural width of `image` (the first element `selector` finds), once the browser loaded it: the
    page is there before its image, and a width says the browser decoded it."""
    await image.wait_for(timeout=10_000)
    await page.wait_for_function(f"() => document.querySelector({selector!r}).complete", timeout=10_000)
    return await image.get_attribute("alt"), await image.evaluate("img => img.naturalWidth")


async def downloaded_text(page: Page, link: Locator) -> str:
    """The text of the file a click on `link` downloads (a download, not a page shown)."""
    async with page.expect_download() as download:
        await link.click()
    saved = await (await download.value).path()
    return await asyncio.to_thread(Path(saved).read_text)
