"""Files over A2A (issue 35), with the a2a-sdk's own client: a `FilePart` in is kept under the conversation and
read by a script under /input; the files the turn's scripts give back come with the answer as artifacts; a file
too large, by URL or sent to an agent that keeps no files fails the task saying so."""

from __future__ import annotations

import base64
import contextlib
import re
import uuid
from collections.abc import AsyncIterator

import aiohttp
from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageConfiguration, SendMessageRequest, TaskState
from aiohttp import web

from rockbot.agent.a2a_server import MAX_A2A_FILE_BYTES
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.agent.server import build_app
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, MemoryBroker, Principal
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.file_writes import FileWriteAnswerer
from rockbot.console.store import Store
from rockbot.contracts.recording import run_id_prefix
from rockbot.local.runs import StoreFileKeeper, store_publisher
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_a2a import TOKEN, a2a_client, answer_of
from tests.buses import login
from tests.fixtures.llm import ScriptedCall, Turn

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
SALES = b"month,revenue\n2026-01,10\n2026-02,\n"
SCRIPT = f"""
import base64
import re
rows = [r for r in open("/input/sales.csv").read().splitlines() if not r.endswith(",")]
open("/output/clean.csv", "w").write("\\n".join(rows) + "\\n")
open("/output/chart.png", "wb").write(base64.b64decode("{base64.b64encode(PNG).decode()}"))
"""


@contextlib.asynccontextmanager
async def a2a_agent(llm, store: Store, *, console_url: str = "") -> AsyncIterator[tuple[str, FileStore, str]]:
    """The agent's HTTP server (A2A) with scripts, its files kept in `store` as `rockbot local` keeps them and
    read for the scripts-manager (the local sandbox) as the console answers them."""
    broker, files = MemoryBroker(), FileStore(store=store)
    console = await login(broker, CONSOLE)
    reads, writes = FileReadAnswerer(files=files, bus=console), FileWriteAnswerer(files=files, bus=console)
    await reads.start()
    await writes.start()
    manager = ScriptsManager(
        settings=ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0),
        bus=await login(broker, SCRIPTS_MANAGER))  # fmt: skip
    await manager.start()
    config = agent_config(llm_url=llm.url, name="calc", builtin_tools=["scripts"])
    bus = await login(broker, Principal.agent(namespace=config.namespace, name=config.name))
    sandbox = ScriptSandbox.for_agent(bus=bus, config=config, keeper=StoreFileKeeper(
        files, namespace=config.namespace, agent=config.name))  # fmt: skip
    runtime = AgentRuntime.from_config(config, bus=bus, sandbox=sandbox, env={API_KEY_ENV: "k"},
                                       publish_runs=store_publisher(store, namespace=config.namespace,
                                                                    agent=config.name))  # fmt: skip
    runner = web.AppRunner(build_app(runtime=runtime, token=TOKEN, console_url=console_url), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await runtime.start()
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", files, config.namespace
    finally:
        await runner.cleanup()
        await runtime.close()
        await manager.stop()
        await reads.stop()
        await writes.stop()


def with_files(text: str, *parts: Part) -> SendMessageRequest:
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[new_text_part(text), *parts])
    return SendMessageRequest(message=message, configuration=SendMessageConfiguration())


async def test_a_file_part_in_is_read_by_a_script_and_its_files_come_back_as_artifacts(scripted_llm, store) -> None:
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": SCRIPT})]),
                      Turn(text="Cleaned and charted."))  # fmt: skip
    async with a2a_agent(scripted_llm, store) as (url, files, namespace), a2a_client(url, streaming=False) as client:
        request = with_files("clean this", Part(raw=SALES, filename="sales.csv", media_type="text/csv"))
        [sent] = [event async for event in client.send_message(request)]
        task = sent.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
        kept = await files.conversation(owner=FileOwner(namespace=namespace, agent="calc", caller="a2a",
                                                        session_id=task.context_id))  # fmt: skip
    assert scripted_llm.requests[0].messages[-1]["content"] == (
        f"clean this\n\n[attached, read-only for scripts under /input: sales.csv (text/csv, {len(SALES)} bytes)]")
    by_id = {artifact.artifact_id: artifact for artifact in task.artifacts}
    assert answer_of(type(task)(artifacts=[by_id["answer"]])) == "Cleaned and charted."
    made = [(a.name, a.parts[0].filename, a.parts[0].media_type, a.parts[0].raw) for a in
            (by_id["file-1"], by_id["file-2"])]
    assert made == [("chart.png", "chart.png", "image/png", PNG),
                    ("clean.csv", "clean.csv", "text/csv", b"month,revenue\n2026-01,10\n")]
    assert sorted((f.name, f.origin) for f in kept) == [("chart.png", "script"), ("clean.csv", "script"),
                                                        ("sales.csv", "upload")]
    # The upload is kept with the turn's run, as its scripts' files are (the run's page lists all three).
    [run_id] = {f.run_id for f in kept}
    assert run_id.startswith(run_id_prefix(namespace=namespace, agent="calc")), run_id


async def test_a_file_too_large_or_by_url_fails_the_task_saying_why(scripted_llm, store) -> None:
    async with a2a_agent(scripted_llm, store) as (url, _, _), a2a_client(url, streaming=False) as client:
        failures = []
        for part in (Part(raw=b"x" * (MAX_A2A_FILE_BYTES + 1), filename="big.bin"),
                     Part(url="http://example.invalid/sales.csv", filename="sales.csv"),
                     Part(raw=b"x", filename="../escape.csv")):
            [sent] = [event async for event in client.send_message(with_files("look", part))]
            assert sent.task.status.state == TaskState.TASK_STATE_FAILED
            failures.append(sent.task.status.message.parts[0].text)
    assert failures == [
        f"file 1: {MAX_A2A_FILE_BYTES + 1:,} bytes, over the bound of {MAX_A2A_FILE_BYTES:,}",
        "file 1: a file by URL is not fetched; send its bytes (raw)",
        "file 1: filename: Value error, a file name is a relative path without empty, '.' or '..' parts (such as "
        "'charts/a.png')",
    ]
    assert not scripted_llm.requests  # none reached the model


async def test_the_openai_endpoint_names_a_turns_files_with_the_consoles_links(scripted_llm, store) -> None:
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={
        "script": SCRIPT.replace('open("/input/sales.csv").read()', '"month,revenue\\\\n2026-01,10"')})]),
        Turn(text="Done."))  # fmt: skip
    async with a2a_agent(scripted_llm, store) as (url, files, _), aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
                             json={"model": "calc", "messages": [{"role": "user", "content": "chart"}]}) as answer:
            assert answer.status == 200, await answer.text()
            content = (await answer.json())["choices"][0]["message"]["content"]
        links = re.findall(r"^- (\S+) \((\S+), [\d,]+ bytes\): /api/files/(f[0-9a-f]{32})$", content, re.M)
        assert content.startswith("Done.\n\nFiles (from the console, for whoever may read this agent's runs):\n")
        assert [(name, kind) for name, kind, _ in links] == [("chart.png", "image/png"), ("clean.csv", "text/csv")]
        found = await files.read_any(links[0][2])
    assert found is not None and found[1] == PNG


async def test_a_file_too_large_for_the_scripts_answer_is_kept_by_the_manager_and_linked_in_the_a2a_answer(
    scripted_llm, store
) -> None:
    """A 5 MiB CSV does not fit in the script's answer (about 3.5 MiB of files): the scripts-manager keeps it in the
    console a chunk at a time and the A2A answer links it; the chart, small, still comes with its bytes."""
    script = SCRIPT.replace('open("/input/sales.csv").read()', '("month,revenue\\n" + "2026-01,10\\n" * 480_000)')
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": script})]),
                      Turn(text="Cleaned and charted."))  # fmt: skip
    async with a2a_agent(scripted_llm, store, console_url="https://console.example") as (url, files, namespace), \
            a2a_client(url, streaming=False) as client:  # fmt: skip
        [sent] = [event async for event in client.send_message(with_files("clean this"))]
        task = sent.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
        kept = await files.conversation(owner=FileOwner(namespace=namespace, agent="calc", caller="a2a",
                                                        session_id=task.context_id))  # fmt: skip
        by_name = {file.name: file for file in kept}
        found = await files.read(by_name["clean.csv"].id, owner=FileOwner(
            namespace=namespace, agent="calc", caller="a2a", session_id=task.context_id))  # fmt: skip
    told = scripted_llm.requests[1].messages[-1]["content"]
    assert "- clean.csv (text/csv, 5,280,014 bytes)\n    month,revenue\n    2026-01,10" in told, told
    assert "left out" not in told, told
    assert found is not None and found[1] == b"month,revenue\n" + b"2026-01,10\n" * 480_000
    by_id = {artifact.artifact_id: artifact for artifact in task.artifacts}
    chart, csv = by_id["file-1"].parts[0], by_id["file-2"].parts[0]
    assert (chart.filename, chart.raw) == ("chart.png", PNG)
    assert (csv.filename, csv.media_type, csv.url, csv.raw) == (
        "clean.csv", "text/csv", f"https://console.example/api/files/{by_name['clean.csv'].id}", b"")
    assert sorted((f.name, f.origin, f.size) for f in kept) == [("chart.png", "script", len(PNG)),
                                                               ("clean.csv", "script", 5_280_014)]  # fmt: skip
