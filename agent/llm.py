"""A client for any OpenAI-compatible Chat Completions endpoint (OpenAI, OpenRouter, vLLM, Ollama, llama.cpp).

Streaming is the default: text deltas go to the caller as they arrive, while `tool_calls` deltas
are accumulated by their `index` (id, name and argument fragments arrive spread over many
chunks, interleaved between calls) and handed over whole when the stream ends. Non-streaming
requests return the same `Completion`.

429 and 5xx answers (and connection failures) are retried with exponential backoff and jitter,
honouring `Retry-After` up to a cap; a retry only ever happens before any of the answer was
passed on, so the caller never sees text twice: a stream that breaks after a text delta went out
fails with `LlmStreamBroken` instead. A 401/403 and an unknown model fail at once with an error
that says what to fix, because retrying cannot help.

`timeout_seconds` bounds the connection and each wait for more bytes (`sock_read`), not the whole
answer: a long stream that keeps sending is never cut, a silent endpoint is, and is tried only
`TIMEOUT_ATTEMPTS` times.

Endpoints answer imperfectly, and each way is read for what it is: a plain JSON completion answering
a stream request is the answer; a 200 that is neither (an HTML page, an `{"error"}` body, no
choices) fails naming what came; a stream that ends without `finish_reason` or `[DONE]` is broken,
not complete; `finish_reason: length` is kept (`Completion.cut_off`); tool-call deltas that repeat
the id and name in every chunk are one id and one name.

Each `complete()` is one span (`chat <model>`, OpenTelemetry's GenAI conventions: model, tokens in
and out, finish reason, retries as events); each HTTP attempt goes to the observers (metrics, the
daily budget). The messages go into the span only with the content opt-in (`rockbot.telemetry`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from opentelemetry.trace import Span, SpanKind
from pydantic import BaseModel, ConfigDict, Field
from yarl import URL

from rockbot.telemetry import capture_content, tracer

TextSink = Callable[[str], Awaitable[None]]
#: `gen_ai.system` of every request: the protocol spoken (OpenAI's), whoever serves it (`server.address` says).
SYSTEM = "openai"
#: Attempts at a request that timed out (an overloaded endpoint, 429/5xx, gets `max_attempts`).
TIMEOUT_ATTEMPTS = 2


class LlmError(Exception):
    """The model endpoint could not give an answer."""

    def __init__(
        self, message: str, *, status: int | None = None, retryable: bool = False, retry_after: float | None = None
    ):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after


class LlmAuthError(LlmError):
    """The endpoint refused the API key (401/403)."""


class LlmModelNotFound(LlmError):
    """The endpoint does not know the configured model name."""


class LlmTimeout(LlmError):
    """The endpoint sent nothing for the request timeout; retried once only, since a hung endpoint stays hung."""


class LlmStreamBroken(LlmError):
    """The stream broke after part of the answer reached the caller; retrying would repeat that part."""


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = ""

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )

    def openai(self) -> dict[str, int]:
        """As OpenAI's `usage` object."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


class Completion(BaseModel):
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)

    @property
    def cut_off(self) -> bool:
        """The model stopped at its output token limit, mid-answer."""
        return self.finish_reason == "length"

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the history."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = [call.message() for call in self.tool_calls]
        return message


class Attempt(BaseModel):
    """One HTTP request to the model endpoint: its status (`200`, `429`, `error`...), what it used, how long it took."""

    model_config = ConfigDict(frozen=True)

    model: str
    status: str
    usage: Usage | None = None
    seconds: float
    #: Why the model stopped (`stop`, `tool_calls`, `length`...), for an answered request.
    finish_reason: str | None = None


AttemptObserver = Callable[[Attempt], None]


class LlmClient:
    """One model at one endpoint. Create it inside a running event loop; `close()` when done."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str | None = None,
        temperature: float | None = None,
        timeout_seconds: float = 60.0,
        max_attempts: int = 4,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 20.0,
        observers: Iterable[AttemptObserver] = (),
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key
        self._api_key_env = api_key_env
        self._temperature = temperature
        self._timeout_seconds = timeout_seconds
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=min(timeout_seconds, 30.0), sock_connect=min(timeout_seconds, 10.0),
            sock_read=timeout_seconds,
        )
        self._max_attempts = max(1, max_attempts)
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._observers = list(observers)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(
        self,
        *,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        stream: bool = True,
        on_text: TextSink | None = None,
        model: str | None = None,
    ) -> Completion:
        """One completion; `model` replaces the client's model for this request (a replay's `--model`)."""
        model = model or self.model
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
        if tools:
            body["tools"] = tools
        if self._temperature is not None:
            body["temperature"] = self._temperature
        if stream:
            body["stream_options"] = {"include_usage": True}
        with tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT) as span:
            if span.is_recording():
                span.set_attributes(self._request_attributes(body))
            completion = await self._complete(body, stream=stream, on_text=on_text, span=span)
            if span.is_recording():
                span.set_attributes(_response_attributes(completion))
            return completion

    async def _complete(
        self, body: dict[str, Any], *, stream: bool, on_text: TextSink | None, span: Span
    ) -> Completion:
        passed_on = False

        async def relay(text: str) -> None:
            nonlocal passed_on
            passed_on = True
            if on_text is not None:
                await on_text(text)

        for attempt in range(1, self._max_attempts + 1):
            started = time.perf_counter()
            try:
                completion = await self._attempt(body, stream=stream, on_text=relay)
            except LlmError as error:
                status = f"{error.status or 'error'}"
                self._observe(Attempt(model=body["model"], status=status, seconds=time.perf_counter() - started))
                last = attempt == self._max_attempts or (isinstance(error, LlmTimeout) and attempt >= TIMEOUT_ATTEMPTS)
                if passed_on or not error.retryable or last:
                    span.set_attribute("error.type", status)
                if passed_on:
                    raise LlmStreamBroken(
                        f"{error} (after part of the answer was already streamed, so it is not retried: "
                        "a retry would repeat that text; ask again)",
                        status=error.status,
                    ) from error
                if not error.retryable or last:
                    if error.retryable:
                        raise LlmError(
                            f"{error} (gave up after {attempt} attempts)", status=error.status, retryable=True
                        ) from error
                    raise
                delay = self._delay(attempt, error.retry_after)
                span.add_event("retry", {"http.response.status_code": status, "rockbot.llm.retry_in_seconds": delay})
                await asyncio.sleep(delay)
                continue
            span.set_attribute("rockbot.llm.attempts", attempt)
            self._observe(Attempt(model=body["model"], status="200", usage=completion.usage,
                                  seconds=time.perf_counter() - started, finish_reason=completion.finish_reason))
            return completion
        raise AssertionError("unreachable")

    def _observe(self, attempt: Attempt) -> None:
        for observer in self._observers:
            observer(attempt)

    def _request_attributes(self, body: dict[str, Any]) -> dict[str, Any]:
        """GenAI semantic conventions for the request; the messages only with the content opt-in."""
        url = URL(self.base_url)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": SYSTEM,
            "gen_ai.provider.name": SYSTEM,
            "gen_ai.request.model": self.model,
            "server.address": url.host or "",
            "server.port": url.port or 0,
            "rockbot.llm.stream": bool(body.get("stream")),
            "rockbot.llm.tools_offered": len(body.get("tools") or ()),
        }
        if self._temperature is not None:
            attributes["gen_ai.request.temperature"] = self._temperature
        if capture_content():
            attributes["gen_ai.input.messages"] = json.dumps(body["messages"], ensure_ascii=False, default=str)
        return attributes

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self._max_backoff)
        base = min(self._backoff * 2 ** (attempt - 1), self._max_backoff)
        return base * (0.5 + random.random() / 2)

    async def _attempt(self, body: dict[str, Any], *, stream: bool, on_text: TextSink | None) -> Completion:
        session = self._session
        if session is None:
            session = self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        url = f"{self.base_url}/chat/completions"
        try:
            async with session.post(url, json=body, headers=headers) as response:
                if response.status != 200:
                    raise await self._failure(response)
                return await self._answer(response, url=url, on_text=on_text)
        except TimeoutError:
            raise LlmTimeout(
                f"the model endpoint {url} did not answer within {self._timeout_seconds:g} s (raise the Agent's "
                "spec.model.requestTimeoutSeconds for a slow model)", retryable=True,
            ) from None
        except aiohttp.ClientError as exc:
            raise LlmError(f"cannot reach the model endpoint {url}: {exc}", retryable=True) from exc

    async def _answer(self, response: aiohttp.ClientResponse, *, url: str, on_text: TextSink | None) -> Completion:
        """A 200 answer read by what it is, not by what was asked for: some endpoints ignore `stream`."""
        kind = response.content_type
        if kind == "text/event-stream":
            return await _read_stream(response, on_text=on_text)
        text = await response.text()
        if kind != "application/json" and not kind.endswith("+json"):
            raise LlmError(f"the model endpoint {url} answered HTTP 200 with {kind or 'no content type'}, not a "
                           f"completion: {text.strip()[:200] or 'an empty body'}. Check the Agent's spec.model.baseUrl "
                           "(it ends with the API's /v1)")  # fmt: skip
        try:
            data = json.loads(text)
        except ValueError:
            raise LlmError(f"the model endpoint {url} answered HTTP 200 with {kind} that is not JSON: "
                           f"{text.strip()[:200] or 'an empty body'}") from None  # fmt: skip
        completion = _parse_completion(data)
        if completion.content and on_text is not None:
            await on_text(completion.content)
        return completion

    async def _failure(self, response: aiohttp.ClientResponse) -> LlmError:
        text = (await response.text())[:500]
        detail = _error_message(text)
        status = response.status
        if status in (401, 403):
            where = f"the environment variable {self._api_key_env}" if self._api_key_env else "the model API key"
            missing = "" if self._api_key else " (no API key is set)"
            return LlmAuthError(
                f"the model endpoint {self.base_url} refused the API key (HTTP {status}){missing}: {detail}. "
                f"Check {where} and the Secret behind it.",
                status=status,
            )
        lowered = detail.lower()
        if status == 404 or (status == 400 and "model" in lowered and ("not" in lowered or "unknown" in lowered)):
            return LlmModelNotFound(
                f"the model endpoint {self.base_url} does not know model {self.model!r} (HTTP {status}): {detail}. "
                "Check the model name in the Agent's spec.",
                status=status,
            )
        return LlmError(
            f"the model endpoint {self.base_url} answered HTTP {status}: {detail}",
            status=status,
            retryable=status == 429 or status >= 500,
            retry_after=_retry_after(response.headers.get("Retry-After")),
        )


def _response_attributes(completion: Completion) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": completion.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": completion.usage.completion_tokens,
        "gen_ai.response.finish_reasons": [completion.finish_reason or ""],
        "rockbot.llm.tool_calls": len(completion.tool_calls),
    }
    if capture_content():
        attributes["gen_ai.output.messages"] = json.dumps([completion.message()], ensure_ascii=False)
    return attributes


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip() or "no details"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    return text.strip() or "no details"


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def _parse_completion(data: Any) -> Completion:
    if isinstance(data, dict) and data.get("error"):
        raise _reported_error(data)
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise LlmError(f"the model endpoint sent an answer without choices: {str(data)[:300]}") from None
    calls = [
        ToolCall(
            id=call.get("id") or f"call_{n}",
            name=call["function"]["name"],
            arguments=call["function"].get("arguments") or "",
        )
        for n, call in enumerate(message.get("tool_calls") or [])
    ]
    return Completion(
        content=message.get("content") or "",
        tool_calls=calls,
        finish_reason=choice.get("finish_reason"),
        usage=Usage.model_validate(data.get("usage") or {}),
    )


class _PartialCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments = ""


async def _read_stream(response: aiohttp.ClientResponse, *, on_text: TextSink | None) -> Completion:
    text: list[str] = []
    calls: dict[int, _PartialCall] = {}
    finish_reason: str | None = None
    usage = Usage()
    done = False
    async for data in _sse_events(response):
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise LlmError(f"the model endpoint sent a stream event that is not JSON: {data[:200]}") from None
        if not isinstance(chunk, dict):
            raise LlmError(f"the model endpoint sent a stream event that is not a chunk: {data[:200]}")
        if chunk.get("error"):
            raise _reported_error(chunk)
        if chunk.get("usage"):
            usage = Usage.model_validate(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                text.append(delta["content"])
                if on_text is not None:
                    await on_text(delta["content"])
            for fragment in delta.get("tool_calls") or []:
                partial = calls.setdefault(int(fragment.get("index", len(calls))), _PartialCall())
                partial.id = _grown(partial.id, fragment.get("id"))
                function = fragment.get("function") or {}
                partial.name = _grown(partial.name, function.get("name"))
                partial.arguments += function.get("arguments") or ""
            finish_reason = choice.get("finish_reason") or finish_reason
    if not done and finish_reason is None:
        raise LlmError("the model endpoint's stream ended before the answer was complete (no finish_reason and no "
                       "[DONE])", retryable=True)  # fmt: skip
    tool_calls = [
        ToolCall(id=partial.id or f"call_{index}", name=partial.name, arguments=partial.arguments)
        for index, partial in sorted(calls.items())
    ]
    return Completion(content="".join(text), tool_calls=tool_calls, finish_reason=finish_reason, usage=usage)


def _grown(so_far: str, fragment: str | None) -> str:
    """An id or name fragment added to what came before; one that repeats it whole (some providers send the
    full id and name in every chunk) is the same id or name, not a second copy."""
    if not fragment or fragment == so_far:
        return so_far
    return so_far + fragment


def _reported_error(data: dict[str, Any]) -> LlmError:
    """An `{"error": ...}` body sent with status 200 (or inside a stream); retried when its code says overloaded."""
    error = data["error"]
    code = error.get("code") if isinstance(error, dict) else None
    retryable = isinstance(code, int) and (code == 429 or code >= 500)
    return LlmError(f"the model endpoint reported an error: {_error_message(json.dumps(data))}",
                    status=code if isinstance(code, int) else None, retryable=retryable)  # fmt: skip


async def _sse_events(response: aiohttp.ClientResponse):
    """Yield the `data` of each server-sent event (multi-line data joined with newlines)."""
    lines: list[str] = []
    async for line in _lines(response):
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)


async def _lines(response: aiohttp.ClientResponse):
    """Lines of any length (aiohttp's own line iterator refuses lines over 64 KiB)."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r").decode("utf-8")
    if buffer:
        yield buffer.rstrip(b"\r").decode("utf-8")
