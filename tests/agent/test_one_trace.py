"""One chat request, followed across the real broker through a sub-agent and a script run: one trace.

The lead agent serves HTTP; its agent-backed tool calls the `calc` agent through its inbox on
RabbitMQ; `calc` runs Python through the scripts-manager (local sandbox), also over RabbitMQ. Every
process part has its own broker login, as in a cluster; only the span exporter is shared (in memory).
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from rockbot.agent.sandbox import ScriptSandbox
from rockbot.agent.server import build_app
from rockbot.bus import SCRIPTS_MANAGER
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.telemetry import inject, tracer
from tests.agent.configs import agent_config
from tests.agent.test_inbox import agent, calls
from tests.agent.test_inbox_rabbitmq import on_broker
from tests.fixtures.llm import ScriptedCall, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.fixtures.tracing import Spans

TOKEN = "t0ken"


async def test_a_chat_request_through_a_sub_agent_and_a_script_is_one_trace(scripted_llm, vhost: Vhost, spans: Spans):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="ask_calc", arguments={"message": "What is 6 * 7? Use Python."})]),
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": "print(6 * 7)"})]),  # calc
        Turn(text="42"),  # calc's answer
        Turn(text="The calculator says 42."),
    )
    calc = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    lead = agent_config(llm_url=scripted_llm.url, name="lead", tools=[calls("ask_calc", "calc")],
                        http_token={"env": "UNUSED"})
    team = on_broker(vhost)
    manager = ScriptsManager(settings=ScriptsManagerSettings(
        scripts_backend="local", health_host="127.0.0.1", health_port=0, drain_seconds=0,
        amqp_url=await vhost.url(SCRIPTS_MANAGER),
    ))  # fmt: skip
    runner = None
    try:
        await manager.start()
        await vhost.provision([calc, lead])  # before calc's login: the sandbox needs its connection
        sandbox = ScriptSandbox(bus=await team.connect(agent("calc")), namespace="team-a", agent="calc")
        await team.start(scripted_llm, calc, lead, run=["calc"], sandbox=sandbox)
        [lead_runtime] = await team.start(scripted_llm, calc, lead, run=["lead"])
        runner = web.AppRunner(build_app(runtime=lead_runtime, token=TOKEN), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1/chat/completions"  # type: ignore[union-attr]
        with tracer.start_as_current_span("user's client") as client:
            async with aiohttp.ClientSession() as http, http.post(
                url, json={"messages": [{"role": "user", "content": "6 times 7?"}]},
                headers={"Authorization": f"Bearer {TOKEN}", **inject()},
            ) as response:  # fmt: skip
                assert response.status == 200
                body = await response.json()
        await spans.ended("process InboxReply")  # the last hop back; its span ends with its ack
    finally:
        if runner is not None:
            await runner.cleanup()
        await team.close()
        await manager.stop()

    assert body["choices"][0]["message"]["content"] == "The calculator says 42."
    elsewhere = [s for s in spans.all() if s.context.trace_id != client.get_span_context().trace_id]
    # The manager's start-up check and its isolation canary, each a trace of its own.
    roots = {"check sandbox", "isolation canary"}
    assert {s.name for s in elsewhere if s.parent is None} == roots
    assert all(spans.ancestors(s)[-1] in roots for s in elsewhere if s.parent is not None)

    run = spans.one("run script")
    assert spans.ancestors(run) == [
        "process ScriptInvokeRequest", "publish ScriptInvokeRequest", "execute_tool execute_python_script",
        "invoke_agent calc", "process InboxRequest", "publish InboxRequest", "execute_tool ask_calc",
        "invoke_agent lead", "POST /v1/chat/completions", "user's client",
    ]
    assert sorted(s.name for s in spans.all() if spans.parent_of(s) is run) == [
        "cleanup", "publish RequestAccepted", "queue wait", "run", "start-up"]
    assert run.attributes["rockbot.script.outcome"] == "succeeded" and run.attributes["rockbot.agent"] == "team-a/calc"

    requests = scripted_llm.requests
    lead_turn, calc_turn = spans.one("invoke_agent lead"), spans.one("invoke_agent calc")
    for turn, rounds in ((lead_turn, (requests[0], requests[3])), (calc_turn, (requests[1], requests[2]))):
        assert turn.attributes["gen_ai.usage.input_tokens"] == sum(r.usage["prompt_tokens"] for r in rounds)
        assert turn.attributes["gen_ai.usage.output_tokens"] == sum(r.usage["completion_tokens"] for r in rounds)
        assert [spans.parent_of(s) for s in spans.named("chat scripted-model")].count(turn) == 2
    assert calc_turn.attributes["rockbot.turn.source"] == "agent_call"
    assert calc_turn.attributes["rockbot.turn.depth"] == 1
    assert body["usage"]["prompt_tokens"] == lead_turn.attributes["gen_ai.usage.input_tokens"]
    assert body["usage"]["completion_tokens"] == lead_turn.attributes["gen_ai.usage.output_tokens"]
    model_spans = sorted(spans.named("chat scripted-model"), key=lambda s: s.start_time)
    assert [s.attributes["gen_ai.usage.input_tokens"] for s in model_spans] == [r.usage["prompt_tokens"]
                                                                                for r in requests]
