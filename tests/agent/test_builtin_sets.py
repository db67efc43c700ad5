"""Built-in tool sets: the catalogue is honoured exactly; helpers, whiteboard and guides work."""

from __future__ import annotations

import pytest

from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.toolsets.subagents import Helper, Roster, Whiteboards
from rockbot.contracts.builtin_tools import BUILTIN_TOOLS
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn

# `scheduling` belongs to the scheduling issue: its module plugs in by name (see toolsets.kit).
SETS = sorted({t.tool_set for t in BUILTIN_TOOLS} - {"scheduling"})
SEARCH = {"provider": "searxng", "url": "http://127.0.0.1:9/"}


@pytest.mark.parametrize("tool_set", SETS)
async def test_each_enabled_set_registers_exactly_the_catalogued_tools(scripted_llm, tool_set):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=[tool_set], web_search=SEARCH)
    async with AgentRuntime.from_config(config, env={}) as agent:
        registered = {t.name: t.description for t in agent.registry.list()}
    expected = {t.name: t.description for t in BUILTIN_TOOLS if t.tool_set == tool_set}
    assert registered == expected


async def test_all_sets_together_and_without_web_search_config(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=SETS)
    async with AgentRuntime.from_config(config, env={}) as agent:
        names = [t.name for t in agent.registry.list()]
    expected = [t.name for t in BUILTIN_TOOLS if t.tool_set in SETS and t.name != "web_search"]
    assert sorted(names) == sorted(expected)


async def test_no_sets_no_tools_and_no_tools_sent(scripted_llm):
    scripted_llm.play(Turn(text="plain"))
    async with AgentRuntime.from_config(agent_config(llm_url=scripted_llm.url), env={API_KEY_ENV: "k"}) as agent:
        assert len(agent.registry) == 0
        await agent.chat("s", "hi", caller="service.test")
    assert "tools" not in scripted_llm.requests[0].body


async def test_a_helper_runs_with_a_subset_of_tools_and_reports_on_the_whiteboard(scripted_llm):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="spawn_subagent", arguments={
            "instruction": "Write 'found it' on the whiteboard under 'note'.",
            "tools": ["whiteboard_write"], "wait_seconds": 10})]),
        Turn(tool_calls=[ScriptedCall(name="whiteboard_write", arguments={"key": "note", "value": "found it"})]),
        Turn(text="Helper finished."),  # the helper's final answer
        Turn(tool_calls=[ScriptedCall(name="whiteboard_read", arguments={"key": "note"})]),
        Turn(text="The helper found it."),
    )
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["subagents"])
    async with AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}) as agent:
        result = await agent.chat("s", "delegate", caller="service.test")
        mine = ToolContext(session_id=agent.conversation(caller="service.test", session_id="s").id)
        listing = await agent.registry.invoke("list_subagents", {}, context=mine)
        other = await agent.registry.invoke("list_subagents", {}, context=ToolContext(session_id="s"))
        helper_answer = await agent.registry.invoke("whiteboard_read", {"key": "helper:h1"}, context=mine)
    assert result.answer == "The helper found it."
    helper_request = scripted_llm.requests[1]
    assert helper_request.tool_names == ["whiteboard_write"]
    assert "You are a helper" in helper_request.messages[0]["content"]
    assert scripted_llm.requests[2].messages[-1]["content"] == "Wrote 8 characters under 'note'."
    spawn_answer = scripted_llm.requests[3].messages[-1]["content"]
    assert spawn_answer == "Helper h1 done: Helper finished."
    assert scripted_llm.requests[4].messages[-1]["content"] == "found it"
    assert "| h1 | done |" in listing.content and other.content == "You have started no helpers."
    assert helper_answer.content == "Helper finished."


async def test_helpers_are_refused_unknown_tools_and_cannot_spawn(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["subagents"])
    async with AgentRuntime.from_config(config, env={}) as agent:
        context = ToolContext(session_id="s")
        unknown = await agent.registry.invoke(
            "spawn_subagent", {"instruction": "x", "tools": ["no_such_tool"]}, context=context)
        missing = await agent.registry.invoke("cancel_subagent", {"id": "h9"}, context=context)
    assert unknown.error.code == "InvalidArguments" and "no_such_tool" in unknown.error.message
    assert missing.error.code == "InvalidArguments"


async def test_a_running_helper_can_be_cancelled(scripted_llm):
    scripted_llm.play(Turn(text="never seen", delay_seconds=30))
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["subagents"])
    async with AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}) as agent:
        context = ToolContext(session_id="s")
        started = await agent.registry.invoke("spawn_subagent", {"instruction": "slow"}, context=context)
        assert "Helper h1 started" in started.content
        cancelled = await agent.registry.invoke("cancel_subagent", {"id": "h1"}, context=context)
        listing = await agent.registry.invoke("list_subagents", {}, context=context)
    assert cancelled.content == "Helper h1 cancelled." and "| h1 | cancelled |" in listing.content


async def test_guides_list_every_set_that_offers_one(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["guides", "web", "memory", "subagents", "scripts"])
    async with AgentRuntime.from_config(config, env={}) as agent:
        context = ToolContext(session_id="s")
        listing = await agent.registry.invoke("list_tool_guides", {}, context=context)
        guide = await agent.registry.invoke("get_tool_guide", {"name": "web-tools"}, context=context)
        missing = await agent.registry.invoke("get_tool_guide", {"name": "nope"}, context=context)
    for name in ("web-tools", "working-memory", "subagents", "python-scripts"):
        assert f"| {name} |" in listing.content
    assert guide.content.startswith("# Web tools")
    assert missing.error.code == "InvalidArguments" and "web-tools" in missing.error.message


async def test_scripts_without_a_sandbox_answer_unavailable(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["scripts"])
    async with AgentRuntime.from_config(config, env={}) as agent:
        outcome = await agent.registry.invoke(
            "execute_python_script", {"script": "print(1)"}, context=ToolContext(session_id="s"))
    assert outcome.error.code == "Unavailable" and "sandbox" in outcome.error.message


async def test_a_plugged_in_tool_set_module_is_installed(scripted_llm):
    import types

    module = types.ModuleType("extra_tools")

    async def install(*, registry, kit):
        registry.add(name="ping", description="Ping.", parameters={"type": "object"},
                     executor=lambda args, ctx: _pong())

    async def _pong():
        return "pong"

    module.install = install
    async with AgentRuntime.from_config(agent_config(llm_url=scripted_llm.url), env={}, tool_sets=[module]) as agent:
        outcome = await agent.registry.invoke("ping", {}, context=ToolContext(session_id="s"))
    assert outcome.content == "pong"


class RecordingSandbox:
    """Stands in for the scripts-manager client at its interface: records requests, answers from a list."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.requests = []

    async def execute_python_script(self, **request):
        self.requests.append(request)
        return self.replies.pop(0)


def script_result(**fields):
    from rockbot.contracts.scripts import ScriptInvokeResponse

    return ScriptInvokeResponse(request_id="r", **{"stdout": "", "stderr": "", "exit_code": 0,
                                                   "duration_seconds": 0.5, **fields})


async def test_execute_python_script_goes_through_the_sandbox_client(scripted_llm):
    from rockbot.contracts.errors import ErrorInfo
    from rockbot.contracts.scripts import ScriptInvokeError

    sandbox = RecordingSandbox(
        script_result(stdout="42\n", stderr="warning\n"),
        script_result(exit_code=None, timed_out=True, stdout="partial"),
        ScriptInvokeError(request_id="r", error=ErrorInfo(code="Rejected", message="pip_packages: not allowed")),
    )
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["scripts"], script_limits={"timeout_seconds": 20})
    async with AgentRuntime.from_config(config, env={}, sandbox=sandbox) as agent:
        context = ToolContext(session_id="s", tool_call_id="call_1")
        ok = await agent.registry.invoke(
            "execute_python_script", {"script": "print(42)", "input_data": {"n": 1}}, context=context)
        slow = await agent.registry.invoke("execute_python_script", {"script": "while True: pass"}, context=context)
        refused = await agent.registry.invoke(
            "execute_python_script", {"script": "import numpy", "pip_packages": ["numpy"]}, context=context)
        too_long = await agent.registry.invoke(
            "execute_python_script", {"script": "x", "timeout_seconds": 999}, context=context)
        timeout = agent.registry.get("execute_python_script").timeout
    assert ok.content == "exit code 0 after 0.50 s\n--- stdout ---\n42\n\n--- stderr ---\nwarning\n"
    assert "killed before it exited" in slow.content and "ran out of time" in slow.content
    assert (refused.error.code, refused.error.message) == ("Rejected", "pip_packages: not allowed")
    assert too_long.error.code == "InvalidArguments" and len(sandbox.requests) == 3
    first = sandbox.requests[0]
    assert first["script"] == "print(42)" and first["input_data"] == '{"n": 1}' and first["timeout_seconds"] == 20
    assert first["request_id"].startswith("call_1.") and sandbox.requests[2]["pip_packages"] == ["numpy"]
    assert timeout == 20 + 15 + 2 + 150 + 10  # the limit, the wait for a manager to take it, its start-up


async def test_a_per_conversation_agent_names_each_conversations_session_and_the_model_hears_of_restarts(
        scripted_llm):
    sandbox = RecordingSandbox(script_result(session="new"), script_result(session="restarted"),
                               script_result(session="new"), script_result(session="new"), script_result())
    sessions = {"mode": "PerConversation", "idle_seconds": 300, "max_seconds": 3600}
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["scripts"], script_limits={"sessions": sessions})
    async with AgentRuntime.from_config(config, env={}, sandbox=sandbox) as agent:
        ann, bob = (agent.conversation(caller=caller, session_id="s1").id for caller in ("ann", "bob"))
        first = await agent.registry.invoke("execute_python_script", {"script": "x = 1"},
                                            context=ToolContext(session_id=ann))
        again = await agent.registry.invoke("execute_python_script", {"script": "print(x)"},
                                            context=ToolContext(session_id=ann))
        others = await agent.registry.invoke("execute_python_script", {"script": "print(x)"},
                                             context=ToolContext(session_id=bob))
        # A manager that never held ann's session (another replica, or one started after the holder died) says new.
        elsewhere = await agent.registry.invoke("execute_python_script", {"script": "print(x)"},
                                                context=ToolContext(session_id=ann))
    per_call = agent_config(llm_url=scripted_llm.url, builtin_tools=["scripts"])
    async with AgentRuntime.from_config(per_call, env={}, sandbox=sandbox) as agent:
        plain = await agent.registry.invoke("execute_python_script", {"script": "x"},
                                            context=ToolContext(session_id=ann))
    named = [request["session"] for request in sandbox.requests]
    assert named[0] == named[1] == named[3] and len(named[0]) == 32 and named[2] not in (named[0], None)
    assert named[4] is None
    assert "a new session" in first.content
    assert "the session was restarted; earlier variables are gone" in again.content
    assert "a new session" in others.content
    assert "the session was restarted; earlier variables are gone" in elsewhere.content
    assert "session" not in plain.content


async def test_a_script_backed_tool_runs_its_source_with_the_arguments(scripted_llm):
    from rockbot.contracts.agent_config import FunctionDefinition, ResolvedTool, ScriptBackend, ToolDefinition

    sandbox = RecordingSandbox(script_result(stdout="HELLO"))
    resolved = ResolvedTool(
        definition=ToolDefinition(function=FunctionDefinition(
            name="shout", description="Upper-case a text.",
            parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})),
        source="tool:shout",
        backend=ScriptBackend(source="import json,sys; print(json.load(sys.stdin)['text'].upper())"),
        timeout_seconds=10,
    )
    config = agent_config(llm_url=scripted_llm.url, tools=[resolved])
    async with AgentRuntime.from_config(config, env={}, sandbox=sandbox) as agent:
        outcome = await agent.registry.invoke("shout", {"text": "hello"}, context=ToolContext(session_id="s"))
        tool = agent.registry.get("shout")
    assert "--- stdout ---\nHELLO" in outcome.content and tool.source == "tool:shout"
    assert tool.timeout == 10 + 15 + 2 + 150 + 10
    assert sandbox.requests[0]["input_data"] == '{"text": "hello"}'
    assert sandbox.requests[0]["script"].startswith("import json,sys")


def test_finished_helpers_are_forgotten_oldest_first_running_ones_never():
    roster = Roster(max_kept=2)
    for n in range(1, 5):
        roster.add(Helper(id=f"h{n}", session_id="s", instruction="x", state="done"))
    roster.add(Helper(id="h5", session_id="t", instruction="x"))  # running
    roster.add(Helper(id="h6", session_id="t", instruction="x", state="failed"))
    assert [h.id for h in roster.all()] == ["h4", "h5", "h6"]
    assert roster.get("h1") is None and roster.running_sessions() == {"t"}


def test_idle_whiteboards_are_evicted_least_recently_used_first_busy_ones_kept():
    busy = {"s1"}
    boards = Whiteboards(max_boards=2, busy=lambda: busy)
    boards.write(session_id="s1", key="k", value="v1")  # its session still has a helper running
    boards.write(session_id="s2", key="k", value="v2")
    boards.write(session_id="s3", key="k", value="v3")
    assert boards.sessions() == ["s1", "s3"]
    boards.read(session_id="s1", key="k")  # a read counts as use
    busy.clear()
    boards.write(session_id="s4", key="k", value="v4")
    assert boards.sessions() == ["s1", "s4"] and boards.read(session_id="s3", key="k") is None


async def test_a_blacklisted_tool_asked_for_a_helper_is_refused_like_an_unknown_one(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["subagents", "memory"],
                          tool_blacklist=["whiteboard_write"])
    async with AgentRuntime.from_config(config, env={}) as agent:
        refused = await agent.registry.invoke(
            "spawn_subagent", {"instruction": "x", "tools": ["whiteboard_write"]}, context=ToolContext(session_id="s"))
    assert refused.error.code == "InvalidArguments"
    assert "whiteboard_write" in refused.error.message and "blacklisted" in refused.error.message
    assert not scripted_llm.requests  # no helper started


async def test_the_helper_table_keeps_its_shape_whatever_the_answer_holds(scripted_llm):
    scripted_llm.play(Turn(text="a | b\nsecond line"))
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["subagents"])
    async with AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}) as agent:
        context = ToolContext(session_id="s")
        await agent.registry.invoke("spawn_subagent", {"instruction": "pipes | and\nlines", "wait_seconds": 10},
                                    context=context)
        listing = await agent.registry.invoke("list_subagents", {}, context=context)
    header, rule, row = listing.content.split("\n")
    assert row == r"| h1 | done | pipes \| and lines | a \| b second line |"
    assert header.count("|") == rule.count("|") == 5
