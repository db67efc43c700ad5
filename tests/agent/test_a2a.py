"""The agent over A2A, talked to with the a2a-sdk's own client: card, send, stream, get, cancel, and the token."""

from __future__ import annotations

import contextlib
import socket
import uuid

import aiohttp
import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from aiohttp import web

from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.server import build_app
from rockbot.operator.resolving import SUBAGENT_PARAMETERS
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import Turn

TOKEN = "a2a-s3cret"


@contextlib.asynccontextmanager
async def serving(llm, publish_runs=None, **fields):
    """The agent's HTTP server on loopback; yields (base URL, runtime)."""
    config = agent_config(llm_url=llm.url, builtin_tools=["memory"], **fields)
    runtime = AgentRuntime.from_config(config, env={API_KEY_ENV: "k"}, publish_runs=publish_runs)
    runner = web.AppRunner(build_app(runtime=runtime, token=TOKEN), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await runtime.start()
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", runtime
    finally:
        await runner.cleanup()
        await runtime.close()


@contextlib.asynccontextmanager
async def a2a_client(url: str, *, token: str | None = TOKEN, streaming: bool = True):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        client = await create_client(url, client_config=ClientConfig(httpx_client=http, streaming=streaming))
        try:
            yield client
        finally:
            await client.close()


def ask(text: str, *, context_id: str | None = None, immediately: bool = False) -> SendMessageRequest:
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[new_text_part(text)],
                      context_id=context_id or "")
    return SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=immediately))


def answer_of(task) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


async def test_the_card_is_public_and_names_skills_endpoint_and_bearer_scheme(scripted_llm):
    async with serving(scripted_llm) as (url, _), aiohttp.ClientSession() as http, \
            http.get(f"{url}/.well-known/agent-card.json") as response:
        assert response.status == 200
        card = await response.json()
    assert card["name"] == "helper-bot"
    assert card["supportedInterfaces"][0]["url"] == f"{url}/a2a"
    assert card["capabilities"]["streaming"] is True
    assert "get_from_working_memory" in {skill["id"] for skill in card["skills"]}
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"


async def test_send_answers_with_a_completed_task_that_get_returns(scripted_llm):
    scripted_llm.play(Turn(text="Granite is igneous."), Turn(text="It cools slowly."))
    async with serving(scripted_llm) as (url, _), a2a_client(url, streaming=False) as client:
        [first] = [event async for event in client.send_message(ask("What is granite?"))]
        task = first.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert answer_of(task) == "Granite is igneous."
        fetched = await client.get_task(GetTaskRequest(id=task.id))
        [second] = [e async for e in client.send_message(ask("How does it form?", context_id=task.context_id))]
    assert fetched.status.state == TaskState.TASK_STATE_COMPLETED and answer_of(fetched) == "Granite is igneous."
    assert answer_of(second.task) == "It cools slowly."
    follow_up = scripted_llm.requests[1].messages  # the context is one conversation: the first turn is in it
    assert [m["content"] for m in follow_up if m["role"] in ("user", "assistant")] == [
        "What is granite?", "Granite is igneous.", "How does it form?"]


async def test_an_a2a_turn_is_recorded_as_a_run_like_a_chat_turn(scripted_llm):
    scripted_llm.play(Turn(text="Quartz."))
    published = []

    async def publish(events) -> None:
        published.extend(events.events)

    async with serving(scripted_llm, publish_runs=publish) as (url, _), a2a_client(url, streaming=False) as client:
        [sent] = [e async for e in client.send_message(ask("Hardest common mineral?"))]
    [started] = [e for e in published if e.kind == "run_started"]
    assert (started.source, started.caller, started.session_id) == ("a2a", "a2a", sent.task.context_id)
    assert started.request_id == sent.task.id
    said = [(e.role, e.content) for e in published if e.kind == "message"]
    assert said == [("user", "Hardest common mineral?"), ("assistant", "Quartz.")]
    [ended] = [e for e in published if e.kind == "run_ended"]
    assert ended.outcome == "Succeeded"


async def test_stream_sends_the_answer_as_it_is_written_over_sse(scripted_llm):
    scripted_llm.play(Turn(text="Basalt is a volcanic rock."))
    async with serving(scripted_llm) as (url, _), a2a_client(url) as client:
        events = [event async for event in client.send_message(ask("Basalt?"))]
    chunks = [e.artifact_update.artifact.parts[0].text for e in events if e.HasField("artifact_update")]
    assert len(chunks) > 1 and "".join(chunks) == "Basalt is a volcanic rock."
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED


async def test_a_running_task_can_be_cancelled(scripted_llm):
    scripted_llm.play(Turn(text="too late", delay_seconds=10))  # cancelled long before it answers
    async with serving(scripted_llm) as (url, _), a2a_client(url, streaming=False) as client:
        [started] = [e async for e in client.send_message(ask("Take your time.", immediately=True))]
        cancelled = await client.cancel_task(CancelTaskRequest(id=started.task.id))
        fetched = await client.get_task(GetTaskRequest(id=started.task.id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert fetched.status.state == TaskState.TASK_STATE_CANCELED


async def test_without_the_token_a2a_answers_401(scripted_llm):
    async with serving(scripted_llm) as (url, _):
        async with a2a_client(url, token=None) as client:
            with pytest.raises(A2AClientError, match="401"):
                [e async for e in client.send_message(ask("hi"))]
        async with a2a_client(url, token="wrong") as client:
            with pytest.raises(A2AClientError, match="401"):
                await client.get_task(GetTaskRequest(id="any"))
    assert not scripted_llm.requests


async def test_a_used_up_budget_fails_the_task_with_the_budgets_words(scripted_llm):
    scripted_llm.play(Turn(text="x" * 400))
    async with serving(scripted_llm, limits={"tokens_per_day": 10}) as (url, _), \
            a2a_client(url, streaming=False) as client:
        [first] = [e async for e in client.send_message(ask("spend it"))]
        [refused] = [e async for e in client.send_message(ask("more"))]
    assert first.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert refused.task.status.state == TaskState.TASK_STATE_FAILED
    assert "budget" in refused.task.status.message.parts[0].text.lower()
    assert len(scripted_llm.requests) == 1


def a2a_tool(url: str, *, token_env: str | None = "REMOTE_TOKEN", timeout: float = 30.0) -> dict:
    """A resolved Tool of kind a2a, as the operator renders it."""
    return {
        "definition": {"function": {"name": "ask_geologist", "description": "Ask the geologist agent.",
                                    "parameters": SUBAGENT_PARAMETERS}},
        "source": "tool:ask_geologist",
        "backend": {"kind": "a2a", "url": url, "token": {"env": token_env} if token_env else None},
        "timeout_seconds": timeout,
    }


async def call_remote(llm, url: str, *, env: dict[str, str], **tool) -> object:
    """A second agent whose Tool `ask_geologist` is the A2A agent at `url`; the outcome of one call."""
    config = agent_config(llm_url=llm.url, name="lead", tools=[a2a_tool(url, **tool)])
    async with AgentRuntime.from_config(config, env={API_KEY_ENV: "k", **env}) as lead:
        context = ToolContext(session_id="s")
        return await lead.registry.invoke("ask_geologist", {"message": "Is basalt igneous?"}, context=context)


async def test_a_tool_of_kind_a2a_asks_a_remote_agent_with_the_token_from_its_secret(scripted_llm):
    scripted_llm.play(Turn(text="Yes: basalt is volcanic."))
    async with serving(scripted_llm) as (url, _):
        outcome = await call_remote(scripted_llm, url, env={"REMOTE_TOKEN": TOKEN})
    assert outcome.error is None and outcome.content == "Yes: basalt is volcanic."
    assert scripted_llm.requests[0].messages[-1] == {"role": "user", "content": "Is basalt igneous?"}


async def test_a_refused_token_an_unreachable_agent_and_a_slow_one_are_errors_as_data(scripted_llm):
    scripted_llm.play(Turn(text="slow answer", delay_seconds=5))
    async with serving(scripted_llm) as (url, _):
        refused = await call_remote(scripted_llm, url, env={"REMOTE_TOKEN": "wrong"})
        slow = await call_remote(scripted_llm, url, env={"REMOTE_TOKEN": TOKEN}, timeout=0.5)
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        down = await call_remote(scripted_llm, f"http://127.0.0.1:{bound.getsockname()[1]}",
                                 env={"REMOTE_TOKEN": TOKEN})
    assert (refused.error.code, refused.error.retryable) == ("Unavailable", False)
    assert "refused the token" in refused.error.message and "REMOTE_TOKEN" in refused.error.message
    assert slow.error.code == "Timeout"
    assert (down.error.code, down.error.retryable) == ("Unavailable", True)
