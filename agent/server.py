"""The agent's HTTP face (aiohttp): an OpenAI-compatible chat endpoint, health, readiness and metrics.

`POST /v1/chat/completions` (streaming and not) and `GET /v1/models` let any OpenAI client or chat
UI talk to the agent. The endpoint follows OpenAI's semantics: the client sends the whole
history each time, so nothing is kept between requests except working memory (the chunks of large
tool results), scoped by a session: the `X-Session-Id` header when the client sends one, else one
derived from how the conversation starts (its system messages and first user message, which a client
resends unchanged with every turn), so a conversation keeps its working memory without the header.
Every answer says in `X-Session-Id` which session it used. Clients share the agent's one bearer
token, so two conversations that start with the same words share their working memory; send the
header to keep them apart. While streaming, tool activity is sent as SSE comment lines
(`: tool web_search started`), which OpenAI clients ignore and curl users can read.

The files the turn's scripts give back (kept by the console with the run) are named after the answer, each with
a link the console serves under its RBAC (`GET /api/files/ID`: whoever may read the Agent's runs), on the
console's address when the agent knows it (`ROCKBOT_CONSOLE_URL`), else as a path on it.

Answers carry `usage`: the tokens of every model request of the turn (a stream sends it as a last
chunk without choices when the client asks with `stream_options.include_usage`, as OpenAI does). A
turn the daily token budget refuses is answered 429 (`insufficient_quota`) with `Retry-After`.
Each `/v1/*` request is a server span continuing the caller's trace (`traceparent`), if any.

The endpoint can run scripts on someone's behalf, so `/v1/*` requires `Authorization: Bearer
<token>` with the token from the Secret the operator wires (compared in constant time); without
a configured token it answers 401 to everyone rather than serve openly. `/healthz`, `/readyz`
and `/metrics` are open: they reveal no conversation and probes must reach them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rockbot.agent import a2a_server
from rockbot.agent.budget import BudgetExhausted
from rockbot.agent.events import Event, TextDelta, ToolFinished, ToolStarted
from rockbot.agent.file_keeping import Made, collecting_artifacts
from rockbot.agent.llm import LlmAuthError, LlmError, Usage
from rockbot.agent.runtime import AgentRuntime
from rockbot.health import Readiness
from rockbot.resources.checking import describe
from rockbot.telemetry import server_spans

log = logging.getLogger(__name__)

_ROLES = {"system", "user", "assistant", "tool"}


class ChatRequest(BaseModel):
    """The part of an OpenAI chat request the agent uses; other fields (temperature...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


def build_app(*, runtime: AgentRuntime, token: str | None, readiness: Readiness | None = None,
              console_url: str = "") -> web.Application:
    """The agent's routes; `/readyz` says 200 once the runtime is started and nothing in `readiness` is pending
    (the process adds its inbox there: a pod is ready only once it takes work from every door). `console_url`:
    where the links to a turn's files point (empty: a path on the console)."""
    readiness = readiness or Readiness()
    readiness.check(lambda: None if runtime.ready else "starting: installing tools")
    app = web.Application(middlewares=[server_spans(prefix="/v1/"), _bearer_auth(token)],
                          client_max_size=8 * 1024 * 1024)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _chat(request, runtime, console_url=console_url.rstrip("/"))

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": runtime.config.name, "object": "model", "owned_by": "rockbot"}]}
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if reasons := readiness.reasons():
            return web.Response(text="not ready: " + "; ".join(reasons), status=503)
        return web.Response(text="ready")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=runtime.metrics.exposition(), content_type="text/plain", charset="utf-8")

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    a2a_server.mount(app, runtime=runtime, console_url=console_url.rstrip("/"))
    return app


def _bearer_auth(token: str | None):
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path.startswith("/v1/") or request.path == a2a_server.A2A_PATH:
            given = request.headers.get("Authorization", "").encode()
            if expected is None:
                return _error(401, "this agent's chat endpoint has no token configured (set http_token on the Agent)",
                              "unauthorized")
            if not hmac.compare_digest(given, expected):
                return _error(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the "
                                   "token from the agent's Secret", "unauthorized",
                              headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return middleware


async def _chat(request: web.Request, runtime: AgentRuntime, *, console_url: str) -> web.StreamResponse:
    try:
        data = await request.json()
    except ValueError as exc:
        return _error(400, f"invalid request: the body is not JSON ({exc})", "invalid_request_error")
    try:
        body = ChatRequest.model_validate(data)
        messages = [_message(n, m) for n, m in enumerate(body.messages)]
    except ValidationError as exc:
        return _error(400, f"invalid request: {'; '.join(describe(exc))}", "invalid_request_error")
    except ValueError as exc:
        return _error(400, f"invalid request: {exc}", "invalid_request_error")
    if not runtime.ready:
        return _error(503, "the agent is still starting; try again shortly", "unavailable")
    session_id = request.headers.get("X-Session-Id") or conversation_session(messages)
    session_header = {"X-Session-Id": session_id}
    model = runtime.config.name
    completion_id = f"chatcmpl-{secrets.token_hex(12)}"
    if not body.stream:
        try:
            with collecting_artifacts() as made:
                result = await runtime.complete(messages, session_id=session_id)
        except BudgetExhausted as exc:
            return _exhausted(exc)
        except LlmError as exc:
            return _error(502 if not isinstance(exc, LlmAuthError) else 503, str(exc), "upstream_error")
        return web.json_response(headers=session_header, data={
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": result.answer + files_note(made, console_url)},
                         "finish_reason": "stop"}],
            "usage": result.usage.openai(),
        })
    try:
        await runtime.admit(source="http")  # refused before the stream starts, with a status a client can read
    except BudgetExhausted as exc:
        return _exhausted(exc)

    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **session_header}
    )
    await response.prepare(request)

    with_usage = body.stream_options is not None and body.stream_options.include_usage

    def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, *, usage: Usage | None = None) -> bytes:
        data: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        if with_usage:  # OpenAI's shape: null on every chunk but the last, which has no choices
            data["usage"] = usage.openai() if usage is not None else None
        return f"data: {json.dumps(data)}\n\n".encode()

    async def on_event(event: Event) -> None:
        if isinstance(event, TextDelta):
            await response.write(chunk({"content": event.text}))
        elif isinstance(event, ToolStarted):
            await response.write(f": tool {event.name} started\n\n".encode())
        elif isinstance(event, ToolFinished):
            status = "ok" if event.ok else event.error.code.value  # type: ignore[union-attr]
            await response.write(f": tool {event.name} finished {status}\n\n".encode())

    await response.write(chunk({"role": "assistant", "content": ""}))
    try:
        with collecting_artifacts() as made:
            result = await runtime.complete(messages, session_id=session_id, on_event=on_event)
        if note := files_note(made, console_url):
            await response.write(chunk({"content": note}))
        await response.write(chunk({}, "stop"))
        if with_usage:
            await response.write(chunk(None, usage=result.usage))
    except BudgetExhausted as exc:  # used up by another turn since the check above
        await response.write(f"data: {json.dumps(_quota_error(exc))}\n\n".encode())
    except LlmError as exc:
        error = {"error": {"message": str(exc), "type": "upstream_error", "code": exc.status}}
        await response.write(f"data: {json.dumps(error)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def files_note(made: list[Made], console_url: str) -> str:
    """The kept files of the turn, named after the answer with the console's link to each."""
    kept = [m for m in made if m.file_id]
    if not kept:
        return ""
    lines = [f"- {m.artifact.name} ({m.artifact.media_type}, {m.artifact.size:,} bytes): "
             f"{console_url}/api/files/{m.file_id}" for m in kept]  # fmt: skip
    return "\n\nFiles (from the console, for whoever may read this agent's runs):\n" + "\n".join(lines)


def conversation_session(messages: list[dict[str, Any]]) -> str:
    """A session id for a client that sends none: the same for every turn of one conversation (derived from its
    system messages and first user message, which each turn resends), different for another conversation."""
    first_user = next((n for n, m in enumerate(messages) if m["role"] == "user"), len(messages) - 1)
    opening = [m for m in messages[: first_user + 1] if m["role"] in ("system", "user")]
    digest = hashlib.sha256(json.dumps(opening, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    return f"http-{digest[:24]}"


def _message(index: int, message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role not in _ROLES:
        raise ValueError(f"messages[{index}].role must be one of {sorted(_ROLES)}, got {role!r}")
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    cleaned = {"role": role, "content": content}
    for key in ("tool_calls", "tool_call_id", "name"):
        if key in message:
            cleaned[key] = message[key]
    return cleaned


def _exhausted(exc: BudgetExhausted) -> web.Response:
    """429, as OpenAI answers a used-up quota, with when to try again."""
    return web.json_response(_quota_error(exc), status=429, headers={"Retry-After": str(exc.retry_after_seconds)})


def _quota_error(exc: BudgetExhausted) -> dict[str, Any]:
    return {"error": {"message": str(exc), "type": "insufficient_quota", "code": "token_budget_exhausted"}}


def _error(status: int, message: str, kind: str, *, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status, headers=headers)
