"""Token usage on the chat endpoint, and the daily token budget, over real HTTP and the in-memory bus."""

from __future__ import annotations

import datetime
import json

import aiohttp
import pytest
from aiohttp import web

from rockbot.agent.budget import BudgetExhausted, TokenBudget
from rockbot.agent.llm import Attempt, Usage
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.server import build_app
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.inbox import InboxRequest
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_inbox import CALLER, team  # noqa: F401 (the team fixture)
from tests.fixtures.llm import ScriptedCall, Turn

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADD = ScriptedCall(name="get_from_working_memory", arguments={"key": "nothing"})


def chat(**extra):
    return {"model": "helper-bot", "messages": [{"role": "user", "content": "Hello?"}], **extra}


@pytest.fixture
async def serve(scripted_llm):
    """Serve an agent with these config fields over HTTP; returns its URL and runtime."""
    runners: list[tuple[web.AppRunner, AgentRuntime]] = []

    async def start(**fields) -> tuple[str, AgentRuntime]:
        runtime = AgentRuntime.from_config(
            agent_config(llm_url=scripted_llm.url, builtin_tools=["memory"], **fields), env={API_KEY_ENV: "k"}
        )
        runner = web.AppRunner(build_app(runtime=runtime, token=TOKEN), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        await runtime.start()
        runners.append((runner, runtime))
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", runtime  # type: ignore[union-attr]

    yield start
    for runner, runtime in runners:
        await runner.cleanup()
        await runtime.close()


def summed(requests) -> dict[str, int]:
    prompt = sum(r.usage["prompt_tokens"] for r in requests)
    completion = sum(r.usage["completion_tokens"] for r in requests)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def test_an_answer_carries_the_usage_of_every_model_round_of_the_turn(serve, scripted_llm):
    url, _ = await serve()
    scripted_llm.play(Turn(tool_calls=[ADD]), Turn(text="Nothing there."))
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/v1/chat/completions", json=chat(), headers=AUTH
    ) as response:
        body = await response.json()
    assert len(scripted_llm.requests) == 2
    assert body["usage"] == summed(scripted_llm.requests)
    assert body["usage"]["prompt_tokens"] > scripted_llm.requests[0].usage["prompt_tokens"]


async def test_a_stream_ends_with_a_usage_chunk_when_the_client_asks_for_it(serve, scripted_llm):
    url, _ = await serve()
    scripted_llm.play(Turn(tool_calls=[ADD]), Turn(text="Nothing there."), Turn(text="Plain."))
    async with aiohttp.ClientSession() as http:
        asked = await _stream(http, url, chat(stream=True, stream_options={"include_usage": True}))
        plain = await _stream(http, url, chat(stream=True))
    *rest, last = asked
    assert last["choices"] == [] and last["usage"] == summed(scripted_llm.requests[:2])
    assert all(chunk["usage"] is None and chunk["choices"] for chunk in rest)
    assert all("usage" not in chunk for chunk in plain)


async def test_a_used_up_budget_refuses_the_turn_with_429_and_when_to_retry(serve, scripted_llm):
    url, runtime = await serve(limits={"tokens_per_day": 1})
    scripted_llm.play(Turn(text="The first is admitted."), Turn(text="never asked"))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json=chat(), headers=AUTH) as response:
            assert response.status == 200
        for stream in (False, True):
            async with http.post(f"{url}/v1/chat/completions", json=chat(stream=stream), headers=AUTH) as response:
                assert response.status == 429
                assert 0 < int(response.headers["Retry-After"]) <= 86_400
                error = (await response.json())["error"]
            assert error["type"] == "insufficient_quota" and error["code"] == "token_budget_exhausted"
            assert "daily token budget is used up" in error["message"]
            assert "raise spec.limits.tokensPerDay" in error["message"]
        metrics = runtime.metrics.exposition().decode()
    assert len(scripted_llm.requests) == 1
    assert 'rockbot_agent_turns_total{agent="helper-bot",outcome="budget_exhausted",source="http"} 2.0' in metrics


async def test_a_turn_that_uses_up_the_budget_stops_before_its_next_model_request(serve, scripted_llm):
    url, runtime = await serve(limits={"tokens_per_day": 1})
    scripted_llm.play(Turn(tool_calls=[ADD]), Turn(text="never asked"))
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/v1/chat/completions", json=chat(), headers=AUTH
    ) as response:
        body = await response.json()
    answer = body["choices"][0]["message"]["content"]
    assert answer.startswith("I stopped before finishing: this agent's daily token budget is used up")
    assert len(scripted_llm.requests) == 1 and body["usage"] == summed(scripted_llm.requests)
    metrics = runtime.metrics.exposition().decode()
    assert 'rockbot_agent_turn_tool_calls_sum{agent="helper-bot"} 1.0' in metrics


async def test_the_inbox_answers_a_refused_turn_with_rejected(scripted_llm, team):  # noqa: F811
    scripted_llm.play(Turn(text="spent"))
    await team.start(scripted_llm, agent_config(llm_url=scripted_llm.url, name="frugal", limits={"tokens_per_day": 1}))
    for request_id in ("r1", "r2"):
        reply = await team.ask(name="frugal", request=InboxRequest(
            kind="user_message", request_id=request_id, session_id="s", content="hi", reply_to=CALLER.name))
    assert reply.error is not None and reply.error.code == ErrorCode.REJECTED
    assert "daily token budget is used up" in reply.error.message


def _at(day: int, hour: int) -> datetime.datetime:
    return datetime.datetime(2026, 3, day, hour, tzinfo=datetime.UTC)


async def test_the_day_resets_at_midnight_utc_and_yesterdays_unreported_use_stays_yesterdays():
    now = [_at(1, 23)]
    budget = TokenBudget(tokens_per_day=100, clock=lambda: now[0])
    budget.record(Attempt(model="m", status="200", usage=Usage(prompt_tokens=90, completion_tokens=10), seconds=1))
    with pytest.raises(BudgetExhausted) as refused:
        await budget.admit()
    assert refused.value.retry_after_seconds == 3600
    now[0] = _at(2, 0)
    await budget.admit()
    assert budget.used() == Usage() and budget.take_unsent() == (_at(2, 0).date(), Usage())


async def test_a_replica_that_never_heard_the_days_total_refuses_turns_and_says_why():
    budget = TokenBudget(tokens_per_day=100, reported=True, first_total_seconds=0.05)
    with pytest.raises(BudgetExhausted, match="today's usage over all its replicas is not known yet"):
        await budget.admit()
    budget.confirm(day=budget.day, total=Usage(prompt_tokens=40))
    await budget.admit()
    assert budget.used().total_tokens == 40


async def test_the_days_total_is_the_operators_plus_what_this_replica_used_since():
    budget = TokenBudget(tokens_per_day=100, reported=True)
    use = Usage(prompt_tokens=7, completion_tokens=3)
    budget.record(Attempt(model="m", status="200", usage=use, seconds=1))
    day, sent = budget.take_unsent()
    budget.record(Attempt(model="m", status="200", usage=use, seconds=1))
    assert sent == use and budget.used().total_tokens == 20
    budget.unconfirmed()  # no answer: the tokens go out again
    assert budget.take_unsent() == (day, use + use)
    budget.confirm(day=day, total=Usage(prompt_tokens=50, completion_tokens=20))  # every replica's, these included
    assert budget.used().total_tokens == 70
    budget.confirm(day=day - datetime.timedelta(days=1), total=Usage(prompt_tokens=1))  # yesterday's: ignored
    assert budget.used().total_tokens == 70


async def _stream(http: aiohttp.ClientSession, url: str, body: dict) -> list[dict]:
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) as response:
        assert response.status == 200
        text = await response.text()
    data = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]
