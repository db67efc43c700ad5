"""The run page's Replay button in a real browser (Debian's chromium): a person allowed `create agents/chat` (RBAC on
the real API server) replays a recorded run in recorded mode against the agent process (a real RabbitMQ, the
scripted model asking for the tool with other arguments) and sees the two runs side by side, the changed tool call
marked not run; a person who may only read runs sees no button and is refused the replay. Screenshots in
test-artifacts/console/."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser

from rockbot.kube import KubeClient
from tests.console.conftest import Rbac
from tests.console.test_browser import VIEW, browser, chromium, screenshot  # noqa: F401 (fixtures)
from tests.console.test_browser_chat import CHATTER, Site, person, site  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.waiting import bounded, eventually

pytestmark = pytest.mark.usefixtures("chromium")


async def test_a_person_replays_a_run_from_its_page_and_sees_the_changed_tool_call(
    rbac: Rbac, browser: Browser, site: Site, kube_admin: KubeClient, scripted_llm: ScriptedLLM  # noqa: F811
) -> None:
    ns = site.namespace
    rbac.grant(namespace=ns, user=f"system:serviceaccount:{ns}:alice", rules=CHATTER, name="chatter")
    rbac.grant(namespace=ns, user=f"system:serviceaccount:{ns}:bob", rules=VIEW, name="viewer")
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="list_tool_guides", arguments={})]),
                      Turn(text="There are no guides."))
    steps = [s async for s in site.world.relay.turn(namespace=ns, agent="helper", user="alice", session_id="s1",
                                                     content="Which guides are there?")]  # fmt: skip
    original = steps[-1].run_id  # type: ignore[union-attr]

    async def recorded() -> None:
        run = await site.world.store.get_run(original)
        assert run is not None and run.outcome == "Succeeded"

    await eventually(recorded, within=30)

    alice = await person(browser, site, kube_admin, name="alice")
    await alice.goto(f"{site.url}/runs/{original}")
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="list_tool_guides", arguments={"topic": "rocks"})]),
                      Turn(text="No guide about rocks."))
    await bounded(alice.click("form.replay button"), within=60, what="the replay")
    await alice.wait_for_selector("table.comparison", timeout=60_000)
    text = await alice.inner_text("main")
    assert "differs in tool call 1, answer" in text or "differs in answer, tool call 1" in text
    row = await alice.inner_text("tr.tool.differs")
    assert '{"topic": "rocks"}' in row and "not run: no recorded match" in row
    assert "No guide about rocks." in await alice.inner_text("tr.answer.differs")
    await screenshot(alice, "run-replay")
    replay_id = (await alice.locator("table.comparison tr >> nth=1 >> td >> nth=1").inner_text()).strip()
    await alice.goto(f"{site.url}/runs/{replay_id}")
    assert "Replay of" in await alice.inner_text("main") and original in await alice.inner_text("main")

    bob = await person(browser, site, kube_admin, name="bob")
    await bob.goto(f"{site.url}/runs/{original}")
    assert "There are no guides." in await bob.inner_text("main")
    assert await bob.locator("form.replay").count() == 0
    status = await bob.evaluate("""async () => (await fetch(location.pathname + "/replay", {method: "POST",
        headers: {"X-CSRF-Token": document.querySelector("input[name=csrf]")?.value || ""}})).status""")
    assert status == 403  # may read the run, may not run the agent
    assert len(scripted_llm.requests) == 4  # the original and alice's replay, nothing of bob's
    for page in (alice, bob):
        await page.context.close()
