"""A script's artifacts kept with the conversation: agent -> scripts-manager (local bubblewrap) -> agent ->
`console.files` -> the run store (PostgreSQL and SQLite), and what another agent cannot do with them (issue 35)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import AsyncIterator

from rockbot.agent.file_keeping import BusFileKeeper
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, MemoryBroker, Principal
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.files import FileAnswerer
from rockbot.console.store import Store
from rockbot.contracts.agent_config import AgentConfig
from rockbot.contracts.files import FileContent, SaveFiles
from rockbot.local.runs import store_publisher
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.buses import login
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
SCRIPT = f"""
import base64, os
out = os.environ["ROCKBOT_OUTPUT_DIR"]
open(f"{{out}}/chart.png", "wb").write(base64.b64decode("{base64.b64encode(PNG).decode()}"))
open(f"{{out}}/clean.csv", "w").write("month,revenue\\n2026-01,10\\n")
"""


@contextlib.asynccontextmanager
async def files_and_scripts(store: Store) -> AsyncIterator[tuple[MemoryBroker, FileStore]]:
    """A broker with the console's file answerers (`console.files`, `console.file-reads`) over `store` and a
    scripts-manager on the local sandbox."""
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
    try:
        yield broker, files
    finally:
        await manager.stop()
        for answerer in answerers:
            await answerer.stop()
        await console.close()


@contextlib.asynccontextmanager
async def agent_over(broker: MemoryBroker, store: Store, config: AgentConfig) -> AsyncIterator[AgentRuntime]:
    """The agent of `config`, logged in as itself, its scripts on the broker's scripts-manager, its runs in `store`."""
    bus = await login(broker, Principal.agent(namespace=config.namespace, name=config.name))
    try:
        async with AgentRuntime.from_config(
            config, bus=bus, sandbox=ScriptSandbox.for_agent(bus=bus, config=config), env={API_KEY_ENV: "k"},
            publish_runs=store_publisher(store, namespace=config.namespace, agent=config.name),
        ) as agent:  # fmt: skip
            yield agent
    finally:
        await bus.close()


async def test_a_scripts_files_are_kept_under_its_conversation_and_no_other_agent_adds_to_it(
    scripted_llm, store: Store
) -> None:
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": SCRIPT})]),
        Turn(text="Here is the chart."),
    )
    async with files_and_scripts(store) as (broker, files):
        async with agent_over(broker, store, config) as agent:
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
        other = await login(broker, Principal.agent(namespace=config.namespace, name="other"))
        try:
            refused = await BusFileKeeper(bus=other).save(SaveFiles(
                run_id=result.run_id, caller="console:ann", session_id="s1",
                files=[FileContent(name="evil.html", content=b"<script>alert(1)</script>")],
            ))  # fmt: skip
        finally:
            await other.close()
        assert refused.files == [] and "is not one of agent" in refused.error
        assert len(await files.conversation(owner=owner)) == 2


async def test_a_script_reads_its_conversations_files_the_agent_names_by_reference(scripted_llm, store: Store) -> None:
    """The agent lists its conversation's files on `console.files` and names them by id; the scripts-manager reads
    the bytes from the console (`console.file-reads`) and the script sees them under /input, another
    conversation's file not among them."""
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    owner = FileOwner(namespace=config.namespace, agent="calc", caller="console:ann", session_id="s1")
    script = "import os; print(sorted(os.listdir('/input'))); print(open('/input/sales.csv').read().split()[1])"
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": script})]),
        Turn(text="Read it."),
    )
    async with files_and_scripts(store) as (broker, files):
        await files.save(owner=owner, name="sales.csv", content=b"month,revenue\n2026-01,10\n", origin="upload")
        await files.save(owner=owner.model_copy(update={"session_id": "s2"}), name="other.csv", content=b"no",
                         origin="upload")  # fmt: skip
        async with agent_over(broker, store, config) as agent:
            await agent.chat("s1", "Read the sales.", caller="console:ann")
        told = scripted_llm.requests[1].messages[-1]["content"]
        assert "--- stdout ---\n['sales.csv']\n2026-01,10\n" in told, told


async def test_a_large_tool_result_saved_as_a_file_is_read_whole_by_the_next_script(
    scripted_llm: ScriptedLLM, store: Store
) -> None:
    """A result too long for the context goes to working memory as chunks; `save_result_as_file` keeps it whole as a
    file of the conversation (origin `tool`, with the run), which the next script reads under /input; a name that
    would be a path goes back to the model as an error naming the field."""
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"],
                          model={"max_result_chars": 4000})  # fmt: skip
    squares = "for i in range(3000): print(f'{i},{i * i}')"
    count = "rows = [r for r in open('/input/squares.txt').read().splitlines() if ',' in r]; print(len(rows), rows[-1])"

    def save(body: dict) -> Turn:
        index = [m for m in body["messages"] if m["role"] == "tool"][-1]["content"]
        key = re.search(r"`([0-9a-f]{6})-0`", index).group(1) + "-2"
        return Turn(tool_calls=[
            ScriptedCall(id="bad", name="save_result_as_file", arguments={"key": key, "name": "../etc/squares"}),
            ScriptedCall(id="good", name="save_result_as_file", arguments={"key": key, "name": "squares.txt"}),
        ])  # fmt: skip

    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": squares})]),
        save,
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": count})]),
        Turn(text="3000 rows."),
    )
    async with files_and_scripts(store) as (broker, files):
        async with agent_over(broker, store, config) as agent:
            result = await agent.chat("s1", "Count the squares.", caller="console:ann")
        bad, good = [m["content"] for m in scripted_llm.requests[2].messages if m["role"] == "tool"][-2:]
        error = json.loads(bad)["error"]
        assert error["code"] == "InvalidArguments" and "\nname\n  Value error, a file name is a relative path" in error[
            "message"], bad
        assert "as squares.txt (text/plain)" in good and "read it as /input/squares.txt" in good, good
        told = scripted_llm.requests[3].messages[-1]["content"]
        assert "--- stdout ---\n3000 2999,8994001\n" in told, told
        owner = FileOwner(namespace=config.namespace, agent="calc", caller="console:ann", session_id="s1")
        kept = await files.conversation(owner=owner)
        assert [(f.name, f.origin, f.run_id) for f in kept] == [("squares.txt", "tool", result.run_id)]
