"""A script's artifacts kept with the conversation: agent -> scripts-manager (local bubblewrap) -> agent ->
`console.files` -> the run store (PostgreSQL and SQLite), and what another agent cannot do with them (issue 35)."""

from __future__ import annotations

import base64

from rockbot.agent.file_keeping import BusFileKeeper
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, MemoryBroker, Principal
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.files import FileAnswerer
from rockbot.console.store import Store
from rockbot.contracts.files import FileContent, SaveFiles
from rockbot.local.runs import store_publisher
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.buses import login
from tests.fixtures.llm import ScriptedCall, Turn

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
SCRIPT = f"""
import base64, os
out = os.environ["ROCKBOT_OUTPUT_DIR"]
open(f"{{out}}/chart.png", "wb").write(base64.b64decode("{base64.b64encode(PNG).decode()}"))
open(f"{{out}}/clean.csv", "w").write("month,revenue\\n2026-01,10\\n")
"""


async def test_a_scripts_files_are_kept_under_its_conversation_and_no_other_agent_adds_to_it(
    scripted_llm, store: Store
) -> None:
    broker = MemoryBroker()
    files = FileStore(store=store)
    console = await login(broker, CONSOLE)
    answerer = FileAnswerer(files=files, bus=console)
    await answerer.start()
    manager = ScriptsManager(
        settings=ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0),
        bus=await login(broker, SCRIPTS_MANAGER),
    )
    await manager.start()
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    bus = await login(broker, Principal.agent(namespace=config.namespace, name=config.name))
    other = await login(broker, Principal.agent(namespace=config.namespace, name="other"))
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": SCRIPT})]),
        Turn(text="Here is the chart."),
    )
    try:
        sandbox = ScriptSandbox.for_agent(bus=bus, config=config)
        async with AgentRuntime.from_config(
            config, bus=bus, sandbox=sandbox, env={API_KEY_ENV: "k"},
            publish_runs=store_publisher(store, namespace=config.namespace, agent=config.name),
        ) as agent:  # fmt: skip
            result = await agent.chat("s1", "Chart it.", caller="console:ann")
        told = scripted_llm.requests[1].messages[-1]["content"]
        assert "- chart.png (image/png, 70 bytes)" in told and "not kept" not in told, told
        owner = FileOwner(namespace=config.namespace, agent="calc", caller="console:ann", session_id="s1")
        kept = await files.conversation(owner=owner)
        assert [(f.name, f.media_type, f.origin, f.run_id) for f in kept] == [
            ("chart.png", "image/png", "script", result.run_id), ("clean.csv", "text/csv", "script", result.run_id),
        ]
        found = await files.read(kept[0].id, owner=owner)
        assert found is not None and found[1] == PNG
        # Another agent that learned the run id cannot put files into that conversation.
        refused = await BusFileKeeper(bus=other).save(SaveFiles(
            run_id=result.run_id, caller="console:ann", session_id="s1",
            files=[FileContent(name="evil.html", content=b"<script>alert(1)</script>")],
        ))  # fmt: skip
        assert refused.files == [] and "is not one of agent" in refused.error
        assert len(await files.conversation(owner=owner)) == 2
    finally:
        await manager.stop()
        await answerer.stop()
        for login_ in (bus, other, console):
            await login_.close()


async def test_a_script_reads_its_conversations_files_the_agent_names_by_reference(scripted_llm, store: Store) -> None:
    """The agent lists its conversation's files on `console.files` and names them by id; the scripts-manager reads
    the bytes from the console (`console.file-reads`) and the script sees them under /input, another
    conversation's file not among them."""
    broker = MemoryBroker()
    files = FileStore(store=store)
    console = await login(broker, CONSOLE)
    answerers = [FileAnswerer(files=files, bus=console), FileReadAnswerer(files=files, bus=console)]
    for answerer in answerers:
        await answerer.start()
    manager = ScriptsManager(
        settings=ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0),
        bus=await login(broker, SCRIPTS_MANAGER),
    )
    await manager.start()
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    owner = FileOwner(namespace=config.namespace, agent="calc", caller="console:ann", session_id="s1")
    await files.save(owner=owner, name="sales.csv", content=b"month,revenue\n2026-01,10\n", origin="upload")
    await files.save(owner=owner.model_copy(update={"session_id": "s2"}), name="other.csv", content=b"no",
                     origin="upload")  # fmt: skip
    bus = await login(broker, Principal.agent(namespace=config.namespace, name=config.name))
    script = "import os; print(sorted(os.listdir('/input'))); print(open('/input/sales.csv').read().split()[1])"
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": script})]),
        Turn(text="Read it."),
    )
    try:
        async with AgentRuntime.from_config(
            config, bus=bus, sandbox=ScriptSandbox.for_agent(bus=bus, config=config), env={API_KEY_ENV: "k"},
            publish_runs=store_publisher(store, namespace=config.namespace, agent=config.name),
        ) as agent:  # fmt: skip
            await agent.chat("s1", "Read the sales.", caller="console:ann")
        told = scripted_llm.requests[1].messages[-1]["content"]
        assert "--- stdout ---\n['sales.csv']\n2026-01,10\n" in told, told
    finally:
        await manager.stop()
        for answerer in answerers:
            await answerer.stop()
        for login_ in (bus, console):
            await login_.close()
