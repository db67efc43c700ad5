"""In a real browser: a person approves an agent's waiting `execute_python_script` (run by the scripts-manager in
its local sandbox) and reads the script's output in the run's timeline, denies another call and sees the model's
error there; a model answer with HTML is text. Screenshots in test-artifacts/console/."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import Browser, Page
from prometheus_client import CollectorRegistry

from rockbot.agent.approvals import BusApprover
from rockbot.agent.recording import bus_publisher
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, MemoryBroker, Principal
from rockbot.console.approvals import ApprovalDesk
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import AccessReviewer
from rockbot.console.recording import RecorderMetrics, RunWriter
from rockbot.console.store import Store
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.health import Readiness
from rockbot.kube import AGENTS, KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_approvals import RAN, delete_database
from tests.agent.test_loop import tool_set
from tests.buses import login
from tests.console.conftest import Rbac, agent_body, service_account_token
from tests.console.test_browser import browser, chromium, log_in, screenshot  # noqa: F401 (fixtures)
from tests.fixtures.llm import ScriptedCall, Turn
from tests.waiting import eventually

APPROVER = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}, " \
           "{apiGroups: [rockbot.dev], resources: [agents/approve], verbs: [create]}]"
HOSTILE = "Done. <script>alert('owned')</script><b>not bold</b>"
#: What the approved script does: its output must show in the run.
SCRIPT = "import json, sys\nprint('dropped', json.load(sys.stdin)['name'])\n"


@dataclass(kw_only=True)
class World:
    url: str
    agent: AgentRuntime
    namespace: str
    store: Store


@pytest.fixture
async def world(kube_admin: KubeClient, namespaces: list[str], scripted_llm, tmp_path: Path) -> AsyncIterator[World]:
    mine = namespaces[0]
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="helper"))
    store = await Store.open(url=f"sqlite:///{tmp_path / 'runs.db'}")
    broker = MemoryBroker()
    console_bus = await login(broker, CONSOLE)
    agent_bus = await login(broker, Principal.agent(namespace=mine, name="helper"))
    scripts_bus = await login(broker, SCRIPTS_MANAGER)
    scripts = ScriptsManager(bus=scripts_bus, settings=ScriptsManagerSettings(
        scripts_backend="local", health_host="127.0.0.1", health_port=0))  # the local sandbox (bubblewrap)
    await scripts.start()
    metrics = RecorderMetrics(CollectorRegistry())
    writer = RunWriter(store=store, bus=console_bus, readiness=Readiness(), metrics=metrics)
    await writer.start()
    desk = ApprovalDesk()
    await desk.start(bus=console_bus)
    reviewer = AccessReviewer(kube=kube_admin, ttl=0)
    gate = Gate(tokens=TokenReviewer(kube=kube_admin, ttl=0), sessions=Sessions())
    runner = web.AppRunner(build_app(gate=gate, authorizer=reviewer, kube=kube_admin, desk=desk, store=store))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    RAN.clear()
    config = agent_config(llm_url=scripted_llm.url, name="helper", namespace=mine, builtin_tools=["scripts"],
                          approvals={"delete_database": {"timeout_seconds": 60},
                                     "execute_python_script": {"timeout_seconds": 60}})
    agent = AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, tool_sets=[tool_set(delete_database)],
                                     bus=agent_bus, publish_runs=bus_publisher(agent_bus),
                                     sandbox=ScriptSandbox(bus=agent_bus, namespace=mine, agent="helper"))
    agent.approvals.approver = BusApprover(bus=agent_bus)
    try:
        async with agent:
            yield World(url=f"http://127.0.0.1:{runner.addresses[0][1]}", agent=agent, namespace=mine, store=store)
    finally:
        await desk.stop()
        await writer.stop()
        await scripts.stop()
        await runner.cleanup()
        await scripts_bus.close()
        await agent_bus.close()
        await console_bus.close()
        await store.close()


async def decide_in_browser(page: Page, world: World, *, button: str, reason: str, shot: str) -> None:
    async def waiting() -> None:
        await page.goto(f"{world.url}/approvals")
        assert await page.locator("section.approval").count() == 1, "the agent's call has not reached the console"

    await eventually(waiting, within=10)
    await screenshot(page, shot)
    await page.fill("input[name=reason]", reason)
    await page.click(f"button[value={button}]")
    await page.wait_for_url(f"{world.url}/approvals", timeout=10_000)


async def open_latest_run(page: Page, world: World, *, runs: int, shot: str) -> str:
    """The newest run's page, once the Runs page lists `runs` finished runs."""
    await world.agent.recorder.close()  # send what the agent still buffers (as on its shutdown)
    await world.agent.recorder.start()

    async def recorded() -> None:
        await page.goto(f"{world.url}/runs?namespace={world.namespace}")
        finished = await page.locator("table.runs tbody tr td.outcome-succeeded").count()
        assert finished == runs, f"the Runs page lists {finished} finished runs, not yet {runs}"

    await eventually(recorded, within=10)
    await page.locator("table.runs tbody tr a").first.click()  # newest first
    await page.wait_for_selector("ol.timeline", timeout=10_000)
    await screenshot(page, shot)
    return await page.locator("ol.timeline").inner_text()


async def test_approve_then_deny_in_the_browser_and_read_both_runs(
    rbac: Rbac, browser: Browser, world: World, kube_admin: KubeClient, scripted_llm  # noqa: F811
) -> None:
    token = await service_account_token(kube_admin, namespace=world.namespace, name="alice")
    rbac.grant(namespace=world.namespace, user=f"system:serviceaccount:{world.namespace}:alice", rules=APPROVER,
          name="approver")
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await log_in(page, world.url, token)

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={
                          "script": SCRIPT, "input_data": {"name": "staging"}})]),
                      Turn(text=HOSTILE))
    await page.goto(f"{world.url}/approvals")  # open before anything waits: the page shows new calls by itself
    assert await page.locator("section.approval").count() == 0
    turn = asyncio.create_task(world.agent.chat("s1", "drop staging", caller="http"))
    await page.wait_for_selector("section.approval", timeout=15_000)  # the page reloaded itself with the call
    await decide_in_browser(page, world, button="approve", reason="staging is disposable", shot="approvals")
    await asyncio.wait_for(turn, 30)
    ran = scripted_llm.requests[1].messages[-1]["content"]  # what the model was told: the script ran, once approved
    assert ran.startswith("exit code 0 after ") and "--- stdout ---\ndropped staging\n" in ran, ran
    timeline = await open_latest_run(page, world, runs=1, shot="run")
    assert "WaitingForApproval" in timeline and "Approved" in timeline and "staging is disposable" in timeline
    assert "execute_python_script" in timeline and "dropped staging" in timeline  # the script's output, in the run
    assert HOSTILE in timeline and await page.locator("ol.timeline b").count() == 0  # the model's HTML is text

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="delete_database", arguments={"name": "prod"})]),
                      Turn(text="I was not allowed to."))
    turn = asyncio.create_task(world.agent.chat("s2", "drop prod", caller="http"))
    await decide_in_browser(page, world, button="deny", reason="never prod", shot="approvals-deny")
    await asyncio.wait_for(turn, 10)
    assert RAN == []  # the denied tool never ran
    timeline = await open_latest_run(page, world, runs=2, shot="run-denied")
    assert "Denied" in timeline and "never prod" in timeline and "Rejected" in timeline

    await page.goto(f"{world.url}/agents/{world.namespace}/helper")
    assert await page.locator("table.runs tbody tr").count() == 2  # the Agent's last runs
    await screenshot(page, "agent-runs")
    assert dialogs == []
    await context.close()
