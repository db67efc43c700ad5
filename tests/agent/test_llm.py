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


async def ask_a_silent_endpoint(*, max_attempts: int) -> tuple[LlmError, int]:
    """Ask an endpoint that opens its stream and then says nothing: the error raised and the requests it got."""
    release = asyncio.Event()

    async def silent(request):
        response = await streaming(request)
        await release.wait()
        return response

    async with endpoint(silent) as (url, requests):
        client = LlmClient(base_url=url, model="m", timeout_seconds=0.3, max_attempts=max_attempts,
                           backoff_seconds=0.01)
        try:
            with pytest.raises(LlmError, match=r"did not answer within 0\.3 s") as failed:
                await client.complete(messages=[{"role": "user", "content": "go"}])
        finally:
            release.set()
            await client.close()
    return failed.value, len(requests)


async def test_a_silent_endpoint_times_out_per_read():
    error, requests = await ask_a_silent_endpoint(max_attempts=2)
    assert error.retryable and requests == 2


def chunk(delta: dict, finish_reason: str | None = None) -> bytes:
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    return f"data: {json.dumps(body)}\n\n".encode()


async def ask(handler, **settings) -> tuple:
    """One streamed request to an endpoint answering with `handler`: (completion, text passed on, requests)."""
    received: list[str] = []

    async def on_text(text: str) -> None:
        received.append(text)

    async with endpoint(handler) as (url, requests):
        client = LlmClient(base_url=url, model="m", backoff_seconds=0.01, **{"max_attempts": 1, **settings})
        try:
            completion = await client.complete(messages=[{"role": "user", "content": "rock?"}], on_text=on_text)
        finally:
            await client.close()
    return completion, received, requests


async def test_a_json_completion_answered_to_a_stream_request_is_read_as_the_answer():
    async def plain_json(request):
        return web.json_response({"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "Obsidian"}}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}})

    completion, received, _ = await ask(plain_json)
    assert completion.content == "Obsidian" and completion.usage.completion_tokens == 1
    assert received == ["Obsidian"]  # the caller sees the text as if streamed


@pytest.mark.parametrize(("answer", "content_type", "expected"), [
    ("<html><body>Welcome to nginx</body></html>", "text/html", "text/html"),
    ('{"error": {"message": "Provider returned error", "code": 502}}', "application/json", "Provider returned error"),
    ('{"object": "chat.completion", "choices": []}', "application/json", "without choices"),
    ("", "text/plain", "text/plain"),
])
async def test_a_200_answer_that_is_no_completion_fails_naming_what_came(answer, content_type, expected):
    async def odd(request):
        return web.Response(text=answer, content_type=content_type)

    with pytest.raises(LlmError, match=expected):
        await ask(odd)


async def test_a_stream_that_ends_without_finish_reason_or_done_is_an_error_not_an_answer():
    async def cut(request):
        response = await streaming(request)
        await response.write(chunk({"content": "partial "}))
        return response  # the connection closes cleanly: no finish_reason, no [DONE]

    with pytest.raises(LlmStreamBroken, match="ended before the answer was complete"):
        await ask(cut)


async def test_a_stream_with_finish_reason_but_no_done_is_complete():
    async def no_done(request):
        response = await streaming(request)
        await response.write(chunk({"content": "Marble"}, "stop"))
        return response

    completion, _, _ = await ask(no_done)
    assert completion.content == "Marble" and not completion.cut_off


async def test_an_answer_cut_at_the_length_limit_says_so():
    async def long_answer(request):
        response = await streaming(request)
        await response.write(chunk({"content": "Granite is an igneous"}, "length"))
        await response.write(b"data: [DONE]\n\n")
        return response

    completion, _, _ = await ask(long_answer)
    assert completion.cut_off and completion.finish_reason == "length"


async def test_tool_call_deltas_that_repeat_id_and_name_in_every_chunk_make_one_call():
    async def repeating(request):
        response = await streaming(request)
        for arguments in ('{"a": ', '2, "b"', ': 3}'):
            await response.write(chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                        "function": {"name": "add", "arguments": arguments}}]}))
        await response.write(chunk({}, "tool_calls"))
        await response.write(b"data: [DONE]\n\n")
        return response

    completion, _, _ = await ask(repeating)
    [call] = completion.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == ("c1", "add", {"a": 2, "b": 3})


async def test_a_timeout_is_retried_once_not_as_often_as_an_overloaded_endpoint():
    error, requests = await ask_a_silent_endpoint(max_attempts=4)
    assert requests == 2 and "spec.model.requestTimeoutSeconds" in str(error)
