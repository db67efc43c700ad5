"""The LLM client against loopback servers that misbehave mid-stream (the scripted LLM never does)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from aiohttp import web

from rockbot.agent.llm import LlmClient, LlmError, LlmStreamBroken


def delta(text: str) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]})}\n\n".encode()


@contextlib.asynccontextmanager
async def endpoint(handler):
    """A loopback Chat Completions endpoint answering every request with `handler`; yields (url, requests)."""
    requests: list[dict] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        requests.append(await request.json())
        return await handler(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1", requests
    finally:
        await runner.cleanup()


async def streaming(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


async def test_a_stream_that_breaks_after_text_went_out_is_not_retried():
    text_arrived = asyncio.Event()

    async def one_delta_then_drop(request):
        response = await streaming(request)
        await response.write(delta("Granite is"))
        await asyncio.wait_for(text_arrived.wait(), 10)  # the client has passed the text on: now break
        request.transport.abort()
        return response

    received: list[str] = []

    async def on_text(text: str) -> None:
        received.append(text)
        text_arrived.set()

    async with endpoint(one_delta_then_drop) as (url, requests):
        client = LlmClient(base_url=url, model="m", max_attempts=4, backoff_seconds=0.01)
        try:
            with pytest.raises(LlmStreamBroken) as broken:
                await client.complete(messages=[{"role": "user", "content": "rock?"}], on_text=on_text)
        finally:
            await client.close()
    assert received == ["Granite is"] and len(requests) == 1
    assert "not retried" in str(broken.value) and not broken.value.retryable


async def test_a_stream_that_breaks_before_any_text_is_retried():
    async def drop_first_then_answer(request):
        response = await streaming(request)
        if len(requests) == 1:
            request.transport.abort()
            return response
        await response.write(delta("Basalt"))
        await response.write(b"data: [DONE]\n\n")
        return response

    async with endpoint(drop_first_then_answer) as (url, requests):
        client = LlmClient(base_url=url, model="m", max_attempts=3, backoff_seconds=0.01)
        try:
            completion = await client.complete(messages=[{"role": "user", "content": "rock?"}])
        finally:
            await client.close()
    assert completion.content == "Basalt" and len(requests) == 2


async def test_a_long_stream_that_keeps_sending_is_not_cut_by_the_request_timeout():
    """The timeout bounds each wait for bytes: 4 deltas 0.4 s apart outlast a 1 s timeout in total."""

    async def slow_but_steady(request):
        response = await streaming(request)
        for word in ("a ", "long ", "steady ", "answer"):
            await response.write(delta(word))
            await asyncio.sleep(0.4)
        await response.write(b"data: [DONE]\n\n")
        return response

    async with endpoint(slow_but_steady) as (url, _):
        client = LlmClient(base_url=url, model="m", timeout_seconds=1.0, max_attempts=1)
        try:
            completion = await client.complete(messages=[{"role": "user", "content": "go"}])
        finally:
            await client.close()
    assert completion.content == "a long steady answer"


async def test_a_silent_endpoint_times_out_per_read():
    release = asyncio.Event()

    async def silent(request):
        response = await streaming(request)
        await release.wait()
        return response

    async with endpoint(silent) as (url, requests):
        client = LlmClient(base_url=url, model="m", timeout_seconds=0.3, max_attempts=2, backoff_seconds=0.01)
        try:
            with pytest.raises(LlmError, match="did not answer in time") as failed:
                await client.complete(messages=[{"role": "user", "content": "go"}])
        finally:
            release.set()
            await client.close()
    assert failed.value.retryable and len(requests) == 2
