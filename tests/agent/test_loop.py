"""The tool-calling loop end to end: a runtime talking HTTP+SSE to the scripted LLM."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rockbot.agent.defining import tool
from rockbot.agent.events import TextDelta, ToolFinished, ToolStarted
from rockbot.agent.llm import LlmAuthError, LlmError, LlmModelNotFound
from rockbot.agent.runtime import AgentRuntime
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.inbox import RecordedCall, Replay
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Gauge:
    """Counts how many calls run at the same moment (an ordering fact, not a timing one)."""

    def __init__(self, expected: int):
        self.running = 0
        self.peak = 0
        self.all_in = asyncio.Event()
        self.expected = expected

    def tool(self):
        @tool
        async def slow_lookup(key: str) -> str:
            """Look a key up."""
            self.running += 1
            self.peak = max(self.peak, self.running)
            if self.running == self.expected:
                self.all_in.set()
            await asyncio.sleep(0)  # always yield, so a call run beside this one gets in (even if all_in is set)
            await asyncio.wait_for(self.all_in.wait(), 5)
            self.running -= 1
            return f"value of {key}"

        return slow_lookup


def tool_set(*tools):
    class Module:
        @staticmethod
        async def install(*, registry, kit):
            for t in tools:
                registry.register(t)

    return Module


def runtime_for(llm, *tools, env=None, **fields) -> AgentRuntime:
    config = agent_config(llm_url=llm.url, **fields)
    return AgentRuntime.from_config(
        config, env=env or {API_KEY_ENV: "k"}, tool_sets=[tool_set(*tools)], llm_backoff_seconds=0.001
    )


def tool_messages(request):
    return [m for m in request.messages if m["role"] == "tool"]


async def test_single_tool_call_round_trip(scripted_llm):
    scripted_llm.play(
        Turn(text="Let me add.", tool_calls=[ScriptedCall(name="add", arguments={"a": 2, "b": 3})]),
        Turn(text="2 + 3 = 5."),
    )
    events = []
    async with runtime_for(scripted_llm, add) as agent:
        result = await agent.chat("s1", "What is 2 + 3?", on_event=events.append, caller="service.test")
    assert result.answer == "2 + 3 = 5." and result.tools_called == ["add"] and result.iterations == 2
    first, second = scripted_llm.requests
    assert first.tool_names == ["add"] and first.authorization == "Bearer k"
    assert first.messages[0] == {"role": "system", "content": "You are a test agent."}
    assert first.messages[-1] == {"role": "user", "content": "What is 2 + 3?"}
    assistant = second.messages[-2]
    assert assistant["tool_calls"] == [
        {"id": "call_0_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert second.messages[-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "5"}
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Let me add.\n\n2 + 3 = 5."  # a paragraph break between rounds
    kinds = [type(e).__name__ for e in events if not isinstance(e, TextDelta)]
    assert kinds == ["ToolStarted", "ToolFinished"]


async def test_non_streaming_mode_gives_the_same_result(scripted_llm):
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="add", arguments={"a": 1, "b": 1})]), Turn(text="2"))
    config = agent_config(llm_url=scripted_llm.url)
    agent = AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, tool_sets=[tool_set(add)], stream=False)
    async with agent:
        result = await agent.chat("s", "1+1?", caller="service.test")
    assert result.answer == "2"
    assert all(r.body["stream"] is False for r in scripted_llm.requests)
    assert tool_messages(scripted_llm.requests[1]) == [{"role": "tool", "tool_call_id": "call_0_0", "content": "2"}]


async def test_parallel_calls_run_together_and_answer_in_call_order(scripted_llm):
    gauge = Gauge(expected=3)
    calls = [ScriptedCall(name="slow_lookup", arguments={"key": k}) for k in ("x", "y", "z")]
    scripted_llm.play(Turn(tool_calls=calls), Turn(text="done"))
    async with runtime_for(scripted_llm, gauge.tool()) as agent:
        result = await agent.chat("s", "look up x, y, z", caller="service.test")
    assert result.answer == "done" and gauge.peak == 3
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(scripted_llm.requests[1])] == [
        ("call_0_0", "value of x"), ("call_0_1", "value of y"), ("call_0_2", "value of z")
    ]


async def test_parallel_calls_off_runs_one_at_a_time(scripted_llm):
    gauge = Gauge(expected=99)
    gauge.all_in.set()
    calls = [ScriptedCall(name="slow_lookup", arguments={"key": k}) for k in ("x", "y")]
    scripted_llm.play(Turn(tool_calls=calls), Turn(text="done"))
    async with runtime_for(scripted_llm, gauge.tool(), parallel_tool_calls=False) as agent:
        await agent.chat("s", "look up", caller="service.test")
    assert gauge.peak == 1


async def test_the_model_corrects_a_call_after_an_error(scripted_llm):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="add", arguments='{"a": "two", "b": 3')]),
        Turn(tool_calls=[ScriptedCall(name="add", arguments={"a": "two", "b": 3})]),
        Turn(tool_calls=[ScriptedCall(name="add", arguments={"a": 2, "b": 3})]),
        Turn(text="5"),
    )
    async with runtime_for(scripted_llm, add) as agent:
        result = await agent.chat("s", "add two and 3", caller="service.test")
    assert result.answer == "5" and result.tools_called == ["add", "add", "add"]
    broken = json.loads(tool_messages(scripted_llm.requests[1])[0]["content"])["error"]
    assert broken["code"] == "InvalidArguments" and "not valid JSON" in broken["message"]
    wrong = json.loads(tool_messages(scripted_llm.requests[2])[-1]["content"])["error"]
    assert wrong["code"] == "InvalidArguments" and "a: 'two' is not of type 'integer'" in wrong["message"]
    assert tool_messages(scripted_llm.requests[3])[-1]["content"] == "5"


async def test_unknown_and_blacklisted_tools_are_answered_without_running(scripted_llm):
    ran = []

    @tool
    async def wipe_disk() -> str:
        """Dangerous."""
        ran.append("wipe")
        return "wiped"

    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="wipe_disk"), ScriptedCall(name="summon_dragon"), ScriptedCall(
            name="add", arguments={"a": 1, "b": 2})]),
        Turn(text="I cannot do that."),
    )
    async with runtime_for(scripted_llm, add, wipe_disk, tool_blacklist=["wipe_disk"]) as agent:
        result = await agent.chat("s", "wipe and summon", caller="service.test")
    assert ran == [] and result.answer == "I cannot do that."
    assert scripted_llm.requests[0].tool_names == ["add"]
    answers = tool_messages(scripted_llm.requests[1])
    errors = [json.loads(m["content"])["error"]["code"] for m in answers[:2]]
    assert errors == ["Blacklisted", "ToolNotFound"]
    assert tool_messages(scripted_llm.requests[1])[2]["content"] == "3"
    statuses = agent.metrics.exposition().decode()
    assert 'rockbot_tool_invocations_total{agent="helper-bot",status="Blacklisted",tool="wipe_disk"} 1.0' in statuses
    assert 'rockbot_tool_invocations_total{agent="helper-bot",status="ToolNotFound",tool="<unknown>"} 1.0' in statuses
    assert "summon_dragon" not in statuses  # a name the model invents never becomes a label
    assert 'rockbot_tool_invoke_duration_seconds_count{agent="helper-bot",status="ok",tool="add"} 1.0' in statuses


async def test_a_large_result_is_chunked_and_read_back_from_working_memory(scripted_llm):
    sections = [f"# Section {n}\n\n" + (f"line {n} " * 120 + "\n\n") * 3 for n in range(6)]
    document = "".join(sections)

    @tool
    async def fetch_report() -> str:
        """Fetch the big report."""
        return document

    def read_chunk(body):
        index = tool_messages_from(body)[-1]["content"]
        key = re.search(r"`([0-9a-f]{6})-0`", index).group(1) + "-3"
        return Turn(tool_calls=[ScriptedCall(name="get_from_working_memory", arguments={"key": key})])

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="fetch_report")]), read_chunk, Turn(text="read it"))
    async with runtime_for(
        scripted_llm, fetch_report, builtin_tools=["memory"], model={"max_result_chars": 2000}
    ) as agent:
        result = await agent.chat("s", "summarise the report", caller="service.test")
    assert result.answer == "read it"
    index = tool_messages(scripted_llm.requests[1])[-1]["content"]
    assert f"'fetch_report' returned {len(document)} characters" in index and ": Section 0 (" in index
    assert len(index) <= 2000 // 4
    chunk = tool_messages(scripted_llm.requests[2])[-1]["content"]
    assert chunk in document and chunk.strip() and len(chunk) <= 1000
    kept = agent.conversation(caller="service.test", session_id="s").id  # working memory is the caller's alone
    assert agent.kit.memory.keys(session_id="s") == []
    keys = agent.kit.memory.keys(session_id=kept)
    assert f"`{keys[0]}` to `{keys[-1]}`" in index
    assert "".join(agent.kit.memory.get(session_id=kept, key=k) for k in keys).strip() == document.strip()


def tool_messages_from(body):
    return [m for m in body["messages"] if m["role"] == "tool"]


async def test_a_large_result_brings_the_reader_when_the_memory_set_is_not_enabled(scripted_llm):
    @tool
    async def fetch_report() -> str:
        """Fetch the big report."""
        return "x" * 5000

    def read_chunk(body):
        key = re.search(r"`([0-9a-f]{6}-0)`", tool_messages_from(body)[-1]["content"]).group(1)
        return Turn(tool_calls=[ScriptedCall(name="get_from_working_memory", arguments={"key": key})])

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="fetch_report")]), read_chunk, Turn(text="ok"))
    async with runtime_for(scripted_llm, fetch_report, model={"max_result_chars": 1000}) as agent:
        await agent.chat("s", "go", caller="service.test")
    first, second, third = scripted_llm.requests
    assert first.tool_names == ["fetch_report"]
    assert second.tool_names == ["fetch_report", "get_from_working_memory"]
    assert "get_from_working_memory(key)" in tool_messages(second)[-1]["content"]
    assert tool_messages(third)[-1]["content"] == "x" * 500


async def test_a_large_result_is_cut_when_the_reader_is_blacklisted(scripted_llm):
    @tool
    async def fetch_report() -> str:
        """Fetch the big report."""
        return "x" * 5000

    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="fetch_report")]), Turn(text="ok"))
    async with runtime_for(scripted_llm, fetch_report, model={"max_result_chars": 1000},
                           tool_blacklist=["get_from_working_memory"]) as agent:
        await agent.chat("s", "go", caller="service.test")
    content = tool_messages(scripted_llm.requests[1])[-1]["content"]
    assert content == "x" * 1000 + "\n[result truncated: 4000 characters omitted]"
    assert scripted_llm.requests[1].tool_names == ["fetch_report"]


async def test_max_iterations_ends_with_a_clear_message(scripted_llm):
    call = Turn(tool_calls=[ScriptedCall(name="add", arguments={"a": 1, "b": 1})])
    scripted_llm.play(call, call, call)
    async with runtime_for(scripted_llm, add, max_iterations=2) as agent:
        result = await agent.chat("s", "loop forever", caller="service.test")
        history = agent.conversations.history(agent.conversation(caller="service.test", session_id="s").id)
    assert result.hit_iteration_limit and "max_iterations" in result.answer
    assert len(scripted_llm.requests) == 2 and scripted_llm.remaining == 1
    assert history[-1] == {"role": "assistant", "content": result.answer}


async def test_429_is_retried(scripted_llm):
    scripted_llm.play(Turn(status=429, error="slow down", retry_after=0), Turn(text="hello"))
    async with runtime_for(scripted_llm) as agent:
        result = await agent.chat("s", "hi", caller="service.test")
        metrics = agent.metrics.exposition().decode()
    assert result.answer == "hello" and len(scripted_llm.requests) == 2
    assert 'rockbot_llm_requests_total{agent="helper-bot",model="scripted-model",status="429"} 1.0' in metrics
    assert 'rockbot_llm_requests_total{agent="helper-bot",model="scripted-model",status="200"} 1.0' in metrics
    assert 'rockbot_llm_tokens_total{agent="helper-bot",kind="completion",model="scripted-model"}' in metrics
    assert 'rockbot_llm_request_duration_seconds_count{agent="helper-bot",model="scripted-model",status="429"} 1.0' \
        in metrics


async def test_5xx_is_retried_until_attempts_run_out(scripted_llm):
    scripted_llm.play(*[Turn(status=503, error="overloaded")] * 4, Turn(text="never"))
    async with runtime_for(scripted_llm) as agent:
        with pytest.raises(LlmError, match=r"HTTP 503: overloaded \(gave up after 4 attempts\)"):
            await agent.chat("s", "hi", caller="service.test")
        assert agent.conversations.history("s") == []
    assert len(scripted_llm.requests) == 4


async def test_401_is_a_clear_error_naming_the_env_var(scripted_llm):
    scripted_llm.api_key = "the-right-key"
    scripted_llm.play(Turn(text="never"))
    async with runtime_for(scripted_llm, env={API_KEY_ENV: "a-wrong-key"}) as agent:
        with pytest.raises(LlmAuthError, match=rf"refused the API key \(HTTP 401\).*{API_KEY_ENV}"):
            await agent.chat("s", "hi", caller="service.test")
    assert len(scripted_llm.requests) == 1


async def test_a_wrong_model_name_is_a_clear_error(scripted_llm):
    scripted_llm.play(Turn(text="never"))
    config = agent_config(llm_url=scripted_llm.url, model={"name": "gpt-nonexistent"})
    async with AgentRuntime.from_config(config, env={}) as agent:
        with pytest.raises(LlmModelNotFound, match=r"does not know model 'gpt-nonexistent'.*Check the model name"):
            await agent.chat("s", "hi", caller="service.test")
    assert len(scripted_llm.requests) == 1


async def test_conversations_are_kept_per_session(scripted_llm):
    scripted_llm.play(Turn(text="Hi Ada."), Turn(text="Hi Bob."), Turn(text="You are Ada."))
    async with runtime_for(scripted_llm) as agent:
        await agent.chat("ada", "I am Ada", caller="service.test")
        await agent.chat("bob", "I am Bob", caller="service.test")
        await agent.chat("ada", "Who am I?", caller="service.test")
    last = scripted_llm.requests[2].messages
    assert [m["content"] for m in last[1:]] == ["I am Ada", "Hi Ada.", "Who am I?"]


async def test_tool_events_carry_the_error(scripted_llm):
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="nope")]), Turn(text="ok"))
    events = []

    async def sink(event):
        events.append(event)

    async with runtime_for(scripted_llm) as agent:
        await agent.chat("s", "x", on_event=sink, caller="service.test")
    started, finished = [e for e in events if isinstance(e, ToolStarted | ToolFinished)]
    assert started.name == finished.name == "nope" and finished.error.code == ErrorCode.TOOL_NOT_FOUND


async def test_stream_lines_longer_than_64_kib_and_interleaved_calls_are_read(scripted_llm):
    scripted_llm.chunk_chars = 100_000  # one SSE line per argument string
    big = "x" * 90_000

    @tool
    async def store(blob: str) -> int:
        """Store a blob."""
        return len(blob)

    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="store", arguments={"blob": big}),
                         ScriptedCall(name="add", arguments={"a": 1, "b": 2})]),
        Turn(text="stored"),
    )
    async with runtime_for(scripted_llm, store, add) as agent:
        result = await agent.chat("s", "store it", caller="service.test")
    assert result.answer == "stored"
    assert [m["content"] for m in tool_messages(scripted_llm.requests[1])] == ["90000", "3"]


async def test_the_runtime_is_not_ready_before_start(scripted_llm):
    agent = runtime_for(scripted_llm)
    assert not agent.ready
    await agent.start()
    assert agent.ready
    await agent.close()


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_cut_at_the_output_limit_tells_the_user(scripted_llm, stream):
    scripted_llm.play(Turn(text="Granite forms from slowly", finish_reason="length"))
    events = []
    config = agent_config(llm_url=scripted_llm.url)
    async with AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, stream=stream) as agent:
        result = await agent.chat("s", "granite?", on_event=events.append, caller="service.test")
    assert result.answer.startswith("Granite forms from slowly")
    assert "cut off" in result.answer and "output token limit" in result.answer
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == result.answer


async def test_a_recorded_replay_answers_from_the_record_and_still_reads_a_long_result_back(scripted_llm):
    ran = []

    @tool
    async def fetch_report() -> str:
        """Fetch the big report."""
        ran.append(1)
        return "never"

    def read_chunk(body):
        key = re.search(r"`([0-9a-f]{6}-0)`", tool_messages_from(body)[-1]["content"]).group(1)
        return Turn(tool_calls=[ScriptedCall(name="get_from_working_memory", arguments={"key": key})])

    replay = Replay(of_run="r1", recorded=[RecordedCall(name="fetch_report", arguments="{}", result="y" * 5000)])
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="fetch_report")]), read_chunk, Turn(text="ok"))
    async with runtime_for(scripted_llm, fetch_report, model={"max_result_chars": 1000}) as agent:
        await agent.chat("s", "go", caller="service.test", replay=replay)
    assert ran == []  # the recorded result answered the call
    assert tool_messages(scripted_llm.requests[2])[-1]["content"] == "y" * 500  # read back from working memory
