"""An agent's turns recorded through the console: a chat becomes a run with its messages, model requests, tool
calls and script runs (where each ran), secrets never stored, and a conversation and its working memory continue in
a new process (a restarted pod, another replica)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from rockbot.agent.defining import tool
from rockbot.agent.recording import SessionHistory, bus_publisher
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, AmqpBus, MemoryBroker, Principal
from rockbot.console.recording import HistoryAnswerer, RecorderMetrics, RunWriter
from rockbot.console.runs_cli import describe
from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from rockbot.console.store_schema import working_memory
from rockbot.health import Readiness
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.buses import login
from tests.fixtures.llm import ScriptedCall, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

AGENT = Principal.agent(namespace="team-a", name="helper-bot")
SECRET = "sk-very-secret-key-123"


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


#: A result long enough to go to working memory (over the agent's 1,000-character threshold), in sections.
REPORT = "".join(f"# Section {n}\n" + f"line {n} " * 120 + "\n" for n in range(6))


@tool
async def report() -> str:
    """Fetch the long report."""
    return REPORT


class Tools:
    @staticmethod
    async def install(*, registry, kit):
        registry.register(add)
        registry.register(report)


@pytest.fixture
async def console(store: Store) -> AsyncIterator[tuple[MemoryBroker, Store]]:
    broker = MemoryBroker()
    bus = await login(broker, CONSOLE)
    metrics = RecorderMetrics(CollectorRegistry())
    writer = RunWriter(store=store, bus=bus, readiness=Readiness(), metrics=metrics)
    history = HistoryAnswerer(store=store, bus=bus, metrics=metrics)
    await writer.start()
    await history.start()
    try:
        yield broker, store
    finally:
        await writer.stop()
        await history.stop()
        await bus.close()


async def _agent(broker: MemoryBroker, llm, **fields) -> AgentRuntime:
    bus = await login(broker, AGENT)
    config = agent_config(llm_url=llm.url, **fields)
    runtime = AgentRuntime.from_config(
        config, bus=bus, env={API_KEY_ENV: SECRET}, tool_sets=[Tools], publish_runs=bus_publisher(bus),
        history=SessionHistory(bus=bus),
    )  # fmt: skip
    return await runtime.start()


async def _only_run(store: Store):
    page = await store.list_runs(filters=RunFilter(namespace="team-a", agent="helper-bot"))
    assert len(page.runs) >= 1 and all(run.outcome for run in page.runs)
    return page.runs


async def test_a_chat_is_recorded_as_a_run_with_its_tool_calls(console, scripted_llm) -> None:
    broker, store = console
    scripted_llm.play(
        Turn(text="Adding.", tool_calls=[ScriptedCall(name="add", arguments={"a": 2, "b": 3})]),
        Turn(text=f"It is 5 (and the key is {SECRET})."),
    )
    agent = await _agent(broker, scripted_llm)
    result = await agent.chat("s1", "What is 2 + 3?", caller="http")
    await agent.close()  # sends what is buffered

    runs = await eventually(lambda: _only_run(store))
    assert result.run_id == runs[0].run_id  # what the inbox reply names, and ScheduledTask/Trigger histories keep
    run = await store.get_run(runs[0].run_id)
    assert run is not None
    assert (run.source, run.caller, run.session_id, run.outcome, run.tool_calls) == ("chat", "http", "s1",
                                                                                     "Succeeded", 1)
    assert run.model == "scripted-model" and run.prompt_tokens > 0
    tool = next(entry for entry in run.timeline if entry.kind == "tool_call")
    assert (tool.name, tool.status, tool.data["result"]) == ("add", "ok", "5")
    assert '"a": 2' in tool.data["arguments"]
    assert [e.data["finish_reason"] for e in run.timeline if e.kind == "model_request"] == ["tool_calls", "stop"]
    messages = [(e.name, e.data["content"]) for e in run.timeline if e.kind == "message"]
    assert messages[0] == ("user", "What is 2 + 3?")
    assert SECRET not in run.model_dump_json() and "[redacted]" in messages[-1][1]


async def test_a_conversation_continues_in_a_new_process(console, scripted_llm) -> None:
    broker, store = console
    scripted_llm.play(Turn(text="Nice to meet you, Ann."), Turn(text="You are Ann."))
    first = await _agent(broker, scripted_llm)
    await first.chat("s1", "I am Ann.", caller="agent.team-a.boss")
    await first.close()
    await eventually(lambda: _only_run(store))

    second = await _agent(broker, scripted_llm)  # a restarted pod, or another replica: nothing in memory
    await second.chat("s1", "Who am I?", caller="agent.team-a.boss")
    await second.close()

    sent = [m.get("content") for m in scripted_llm.requests[1].messages]
    assert sent[1:] == ["I am Ann.", "Nice to meet you, Ann.", "Who am I?"]


async def test_working_memory_continues_in_a_new_process_for_that_conversation_only(console, scripted_llm) -> None:
    broker, store = console
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="report", arguments={})]), Turn(text="I have the report."))
    first = await _agent(broker, scripted_llm, model={"max_result_chars": 1000})
    await first.chat("s1", "Fetch the report.", caller="agent.team-a.boss")
    await first.close()
    index = scripted_llm.requests[1].messages[-1]["content"]
    key = re.search(r"keys `([0-9a-f]+-0)`", index)[1]  # the first chunk's key, as the model saw it
    await eventually(lambda: _only_run(store))

    def read_back(answer: str) -> tuple[Turn, Turn]:
        asked = Turn(tool_calls=[ScriptedCall(name="get_from_working_memory", arguments={"key": key})])
        return asked, Turn(text=answer)

    scripted_llm.play(*read_back("Section 0 says line 0."), *read_back("No such chunk."))
    second = await _agent(broker, scripted_llm, model={"max_result_chars": 1000})  # a restarted pod, another replica
    await second.chat("s1", "What does section 0 say?", caller="agent.team-a.boss")
    await second.chat("s1", "And for me?", caller="agent.team-a.intruder")  # the same session id, another caller
    await second.close()

    chunk = scripted_llm.requests[3].messages[-1]["content"]
    assert chunk.startswith("# Section 0\nline 0 ") and REPORT.startswith(chunk)
    refused = scripted_llm.requests[5].messages[-1]["content"]
    assert f"no working-memory entry {key!r}" in refused and "line 0" not in refused


async def test_a_result_chunked_past_a_messages_size_limit_is_stored_whole(console, scripted_llm) -> None:
    """64 chunks of 16,000 two-byte characters are twice what the console reads in one message: the recorder sends
    them in several, and every chunk is stored."""
    broker, store = console

    @tool
    async def huge() -> str:
        """Fetch a huge text."""
        return "é" * 1_200_000

    class Huge:
        @staticmethod
        async def install(*, registry, kit):
            registry.register(huge)

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="huge", arguments={})]), Turn(text="Huge."))
    bus = await login(broker, AGENT)
    agent = AgentRuntime.from_config(agent_config(llm_url=scripted_llm.url), bus=bus, env={API_KEY_ENV: SECRET},
                                     tool_sets=[Huge], publish_runs=bus_publisher(bus))  # fmt: skip
    async with agent:
        await agent.chat("s1", "Fetch it.", caller="http")

    async def stored() -> None:
        async with store.engine.connect() as connection:
            assert await connection.scalar(select(func.count()).select_from(working_memory)) == 64

    await eventually(stored)
    assert agent.recorder.not_recorded.labels("too_large")._value.get() == 0


async def test_metadata_agents_record_no_text_and_none_records_nothing(console, scripted_llm) -> None:
    broker, store = console
    scripted_llm.play(Turn(text="private answer"), Turn(text="unrecorded"))
    quiet = await _agent(broker, scripted_llm, runs={"record": "Metadata"})
    await quiet.chat("s1", "private question", caller="http")
    await quiet.close()
    runs = await eventually(lambda: _only_run(store))
    run = await store.get_run(runs[0].run_id)
    assert run is not None and run.record == "Metadata" and "private" not in run.model_dump_json()

    silent = await _agent(broker, scripted_llm, runs={"record": "None"})
    await silent.chat("s2", "anything", caller="http")
    await silent.close()
    assert len(await _only_run(store)) == 1


async def test_an_unreachable_console_never_fails_a_turn(scripted_llm) -> None:
    broker = MemoryBroker()  # no console: nobody answers history requests, run events pile up unread
    scripted_llm.play(Turn(text="still answering"))
    bus = await login(broker, AGENT)

    async def broken(events) -> None:
        raise ConnectionError("the broker is gone")

    agent = AgentRuntime.from_config(
        agent_config(llm_url=scripted_llm.url), bus=bus, env={API_KEY_ENV: "k"}, publish_runs=broken,
        history=SessionHistory(bus=bus, timeout_seconds=0.2),
    )  # fmt: skip
    await agent.start()
    result = await agent.chat("s1", "hello", caller="http")
    await agent.close()
    assert result.answer == "still answering"
    assert agent.recorder.not_recorded.labels("bus_error")._value.get() > 0


async def test_a_script_run_is_recorded_with_the_sandbox_it_ran_in(vhost: Vhost, store: Store, scripted_llm) -> None:
    """Through the real broker: the scripts-manager's answer says where the script ran, and the run keeps it."""
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": "print(6 * 7)"})]),
        Turn(text="42"),
    )
    manager = ScriptsManager(settings=ScriptsManagerSettings(
        scripts_backend="local", health_host="127.0.0.1", health_port=0, amqp_url=await vhost.url(SCRIPTS_MANAGER)))
    console = await AmqpBus.connect(url=await vhost.url(CONSOLE))
    writer = RunWriter(store=store, bus=console, readiness=Readiness(), metrics=RecorderMetrics(CollectorRegistry()))
    await manager.start()
    await writer.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(AGENT)) as bus:
            config = agent_config(llm_url=scripted_llm.url, builtin_tools=["scripts"])
            agent = AgentRuntime.from_config(
                config, bus=bus, env={API_KEY_ENV: SECRET}, sandbox=ScriptSandbox.for_agent(bus=bus, config=config),
                publish_runs=bus_publisher(bus),
            )  # fmt: skip
            async with agent:
                await agent.chat("s1", "What is 6 x 7?", caller="http")
        runs = await eventually(lambda: _only_run(store))
        run = await store.get_run(runs[0].run_id)
    finally:
        await writer.stop()
        await console.close()
        await manager.stop()
    assert run is not None
    (script,) = [entry for entry in run.timeline if entry.kind == "script_run"]
    assert (script.name, script.status, script.data["stdout"]) == ("local/bwrap", "0", "42\n")
    assert (script.data["backend"], script.data["pod"]) == ("local/bwrap", "")
    assert "script    exit 0 on local/bwrap" in describe(run)
