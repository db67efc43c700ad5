"""The agent's OpenAI-compatible endpoint, health, readiness and metrics, over real HTTP."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.server import build_app
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn

TOKEN = "s3cret-token"


@pytest.fixture
async def agent_url(scripted_llm):
    config = agent_config(llm_url=scripted_llm.url, builtin_tools=["memory"])
    runtime = AgentRuntime.from_config(config, env={API_KEY_ENV: "k"})
    runner = web.AppRunner(build_app(runtime=runtime, token=TOKEN), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        await runtime.start()
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await runtime.close()


def auth(token=TOKEN):
    return {"Authorization": f"Bearer {token}"}


CHAT = {"model": "helper-bot", "messages": [{"role": "user", "content": "Hello?"}]}


async def test_chat_completion_without_streaming(agent_url, scripted_llm):
    scripted_llm.play(Turn(text="Hello from the agent."))
    async with aiohttp.ClientSession() as http, http.post(
        f"{agent_url}/v1/chat/completions", json=CHAT, headers=auth()
    ) as response:
        assert response.status == 200
        body = await response.json()
    assert body["object"] == "chat.completion" and body["model"] == "helper-bot"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello from the agent."}
    assert scripted_llm.requests[0].messages[-1] == {"role": "user", "content": "Hello?"}


async def test_chat_completion_streams_text_and_tool_progress(agent_url, scripted_llm):
    scripted_llm.play(
        Turn(text="Checking. ", tool_calls=[ScriptedCall(name="get_from_working_memory", arguments={"key": "k"})]),
        Turn(text="Nothing stored."),
    )
    async with aiohttp.ClientSession() as http, http.post(
        f"{agent_url}/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth()
    ) as response:
        assert response.status == 200 and response.content_type == "text/event-stream"
        raw = (await response.read()).decode()
    events = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Checking. \n\nNothing stored."  # the text before a tool call does not run into the answer
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert ": tool get_from_working_memory started" in raw
    assert ": tool get_from_working_memory finished InvalidArguments" in raw


@pytest.mark.parametrize("headers", [{}, auth("wrong"), {"Authorization": TOKEN}])
async def test_chat_without_the_right_bearer_token_is_401(agent_url, scripted_llm, headers):
    async with aiohttp.ClientSession() as http, http.post(
        f"{agent_url}/v1/chat/completions", json=CHAT, headers=headers
    ) as response:
        assert response.status == 401
        assert "bearer token" in (await response.json())["error"]["message"]
    assert scripted_llm.requests == []


async def test_without_a_configured_token_the_endpoint_is_closed(scripted_llm):
    runtime = AgentRuntime.from_config(agent_config(llm_url=scripted_llm.url), env={})
    app = build_app(runtime=runtime, token=None)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, headers=auth("anything")
        ) as response:
            assert response.status == 401
            assert "no token configured" in (await response.json())["error"]["message"]
    finally:
        await runner.cleanup()


async def test_bad_requests_name_the_field(agent_url):
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{agent_url}/v1/chat/completions", json={"messages": []}, headers=auth()) as response:
            message = (await response.json())["error"]["message"]
            assert response.status == 400 and message == (
                "invalid request: messages: List should have at least 1 item after validation, not 0")
        async with http.post(f"{agent_url}/v1/chat/completions", data="{", headers=auth()) as response:
            message = (await response.json())["error"]["message"]
            assert response.status == 400 and message.startswith("invalid request: the body is not JSON")
        bad_role = {"messages": [{"role": "wizard", "content": "x"}]}
        async with http.post(f"{agent_url}/v1/chat/completions", json=bad_role, headers=auth()) as response:
            assert response.status == 400 and "messages[0].role" in (await response.json())["error"]["message"]


async def test_model_failure_is_a_502_with_the_reason(agent_url, scripted_llm):
    scripted_llm.play(Turn(status=400, error="context length exceeded"))
    async with aiohttp.ClientSession() as http, http.post(
        f"{agent_url}/v1/chat/completions", json=CHAT, headers=auth()
    ) as response:
        assert response.status == 502
        assert "context length exceeded" in (await response.json())["error"]["message"]


async def test_health_readiness_models_and_metrics(agent_url, scripted_llm):
    scripted_llm.play(Turn(text="hi"))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{agent_url}/healthz") as response:
            assert response.status == 200
        async with http.get(f"{agent_url}/readyz") as response:
            assert response.status == 200
        async with http.get(f"{agent_url}/v1/models", headers=auth()) as response:
            assert [m["id"] for m in (await response.json())["data"]] == ["helper-bot"]
        async with http.post(f"{agent_url}/v1/chat/completions", json=CHAT, headers=auth()) as response:
            assert response.status == 200
        async with http.get(f"{agent_url}/metrics") as response:
            metrics = await response.text()
    assert "# TYPE rockbot_tool_invoke_duration_seconds histogram" in metrics
    assert "# TYPE rockbot_tool_invocations_total counter" in metrics
    assert 'rockbot_llm_requests_total{agent="helper-bot",model="scripted-model",status="200"} 1.0' in metrics
    assert 'rockbot_agent_turns_total{agent="helper-bot",outcome="answered",source="http"} 1.0' in metrics


async def test_without_a_session_header_a_conversation_keeps_one_session_and_is_told_it(agent_url, scripted_llm):
    scripted_llm.play(Turn(text="First."), Turn(text="Second."), Turn(text="Other."), Turn(text="Named."))
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    follow_up = [*first, {"role": "assistant", "content": "First."}, {"role": "user", "content": "And?"}]
    other = [{"role": "user", "content": "Something else"}]
    sessions = []
    async with aiohttp.ClientSession() as http:
        for messages, headers in ((first, {}), (follow_up, {}), (other, {}), (first, {"X-Session-Id": "mine"})):
            async with http.post(f"{agent_url}/v1/chat/completions", json={"messages": messages},
                                 headers={**auth(), **headers}) as response:
                assert response.status == 200
                sessions.append(response.headers["X-Session-Id"])
    assert sessions[0] == sessions[1] != sessions[2]
    assert sessions[3] == "mine"
