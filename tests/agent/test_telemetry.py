"""The agent's spans: an HTTP request, its turn, each model request and tool call, and what they may carry."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from opentelemetry import trace

from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.server import build_app
from rockbot.telemetry import CAPTURE_CONTENT_ENV, inject, tracer
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn
from tests.fixtures.tracing import Spans

TOKEN = "t0ken"
API_KEY = "sk-never-in-a-span-0123456789"
PROMPT = "What is in my secret diary, page 42?"
READ = ScriptedCall(name="get_from_working_memory", arguments={"key": "diary"})


@pytest.fixture
async def agent_url(scripted_llm):
    runtime = AgentRuntime.from_config(
        agent_config(llm_url=scripted_llm.url, builtin_tools=["memory"]), env={API_KEY_ENV: API_KEY},
        llm_backoff_seconds=0.001,
    )  # fmt: skip
    runner = web.AppRunner(build_app(runtime=runtime, token=TOKEN), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    await runtime.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
        await runtime.close()


async def ask(url: str, *, headers: dict[str, str] | None = None) -> dict:
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}", **(headers or {})},
        json={"messages": [{"role": "user", "content": PROMPT}]},
    ) as response:  # fmt: skip
        assert response.status == 200
        return await response.json()


async def test_a_chat_request_is_one_trace_of_its_turn_model_requests_and_tool_calls(agent_url, scripted_llm, spans):
    scripted_llm.play(Turn(tool_calls=[READ]), Turn(text="Nothing there."))
    with tracer.start_as_current_span("client") as client:
        body = await ask(agent_url, headers=inject())

    server = spans.one("POST /v1/chat/completions")
    turn = spans.one("invoke_agent helper-bot")
    model_requests = spans.named("chat scripted-model")
    tool = spans.one("execute_tool get_from_working_memory")
    assert server.kind == trace.SpanKind.SERVER and spans.parent_of(server) is spans.one("client")
    assert server.context.trace_id == client.get_span_context().trace_id
    assert server.attributes["http.response.status_code"] == 200
    assert spans.parent_of(turn) is server and spans.parent_of(tool) is turn
    assert len(model_requests) == 2 and all(spans.parent_of(span) is turn for span in model_requests)

    assert turn.attributes["rockbot.turn.source"] == "http"
    assert turn.attributes["rockbot.turn.outcome"] == "answered"
    assert (turn.attributes["rockbot.turn.iterations"], turn.attributes["rockbot.turn.tool_calls"]) == (2, 1)
    assert turn.attributes["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert turn.attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]

    first = model_requests[0].attributes
    assert (first["gen_ai.operation.name"], first["gen_ai.system"], first["gen_ai.request.model"]) == (
        "chat", "openai", "scripted-model")
    assert first["gen_ai.usage.input_tokens"] == scripted_llm.requests[0].usage["prompt_tokens"]
    assert first["gen_ai.usage.output_tokens"] == scripted_llm.requests[0].usage["completion_tokens"]
    assert tuple(first["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert first["server.address"] == "127.0.0.1"

    assert tool.attributes["gen_ai.tool.name"] == "get_from_working_memory"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_0_0"
    assert tool.attributes["rockbot.tool.source"] == "builtin:memory"
    assert tool.attributes["rockbot.tool.outcome"] == "InvalidArguments"  # nothing stored under that key
    assert tool.status.status_code == trace.StatusCode.ERROR


async def test_prompts_answers_and_secrets_stay_out_of_spans_unless_content_is_opted_in(
    agent_url, scripted_llm, spans, monkeypatch
):
    scripted_llm.play(Turn(tool_calls=[READ]), Turn(text="The diary is empty."))
    await ask(agent_url)
    assert spans.all() and not _mentioning(spans, PROMPT, "diary", API_KEY, TOKEN)

    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    scripted_llm.play(Turn(tool_calls=[READ]), Turn(text="The diary is empty."))
    await ask(agent_url)
    opted_in = {name for name, _ in _mentioning(spans, PROMPT, "diary")}
    assert {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments"} <= opted_in
    assert not _mentioning(spans, API_KEY, TOKEN)  # secrets never, opt-in or not


async def test_a_retried_model_request_shows_its_retries_and_a_failed_one_its_error(agent_url, scripted_llm, spans):
    scripted_llm.play(Turn(status=429, error="slow down", retry_after=0), Turn(text="hello"))
    await ask(agent_url)
    retried = spans.one("chat scripted-model")
    assert [event.name for event in retried.events] == ["retry"]
    assert retried.attributes["rockbot.llm.attempts"] == 2 and "error.type" not in retried.attributes

    scripted_llm.play(Turn(status=401, error="bad key"))
    async with aiohttp.ClientSession() as http, http.post(
        f"{agent_url}/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"},
        json={"messages": [{"role": "user", "content": "hi"}]},
    ) as response:  # fmt: skip
        assert response.status == 503
    failed = spans.named("chat scripted-model")[-1]
    assert failed.attributes["error.type"] == "401" and failed.status.status_code == trace.StatusCode.ERROR
    assert spans.named("invoke_agent helper-bot")[-1].attributes["rockbot.turn.outcome"] == "llm_error"


def _mentioning(spans: Spans, *needles: str) -> list[tuple[str, str]]:
    """(attribute, span) pairs whose value contains any of `needles`: attributes, events and statuses alike."""
    found = []
    for span in spans.all():
        attributes = [*span.attributes.items(), *(item for event in span.events for item in event.attributes.items()),
                      ("status", span.status.description or "")]
        for name, value in attributes:
            text = " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
            if any(needle in text for needle in needles):
                found.append((name, span.name))
    return found
