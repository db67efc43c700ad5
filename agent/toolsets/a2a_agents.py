"""Tools of kind `a2a`: another agent that speaks Agent2Agent, anywhere, asked with the official `a2a-sdk` client.

Each call is one message to the remote agent (the default schema's `message`, or the arguments as JSON);
its finished task's artifacts (or its answer message) are the tool result. The agent card is read from
the URL on first use. The bearer token comes from the env var the operator wired from the Tool's
Secret, read at each call and never logged. The registry's per-Tool timeout bounds the whole call, as
for every tool kind; everything that goes wrong is an error the model reads: a refused token
(`Unavailable`, not retryable, naming the Secret's env var), an agent that cannot be reached
(`Unavailable`, retryable), a task the agent failed or rejected (`ExecutionFailed`).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.helpers.proto_helpers import new_text_part
from a2a.types.a2a_pb2 import Message, Role, SendMessageRequest, TaskState

from rockbot.agent.registry import ToolContext, ToolFailure
from rockbot.agent.toolsets.delegation import instruction
from rockbot.agent.toolsets.kit import ToolKit
from rockbot.contracts.agent_config import A2ABackend, ResolvedTool
from rockbot.contracts.errors import ErrorCode

_FAILED = {TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED, TaskState.TASK_STATE_CANCELED}


def a2a_tool(resolved: ResolvedTool, *, kit: ToolKit):
    backend = resolved.backend
    assert isinstance(backend, A2ABackend)
    held: dict[str, Any] = {}

    async def client() -> Client:
        if "client" not in held:
            http = httpx.AsyncClient(timeout=resolved.timeout_seconds, auth=_Bearer(kit=kit, backend=backend))
            try:
                held["client"] = await create_client(backend.url, client_config=ClientConfig(httpx_client=http,
                                                                                             streaming=False))
            except BaseException:
                await http.aclose()
                raise
            held["http"] = http
            kit.closers.append(http.aclose)
        return held["client"]

    async def execute(args: dict[str, Any], context: ToolContext) -> str:
        message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[new_text_part(instruction(args))])
        try:
            responses = [response async for response in (await client()).send_message(
                SendMessageRequest(message=message))]  # fmt: skip
        except (A2AClientError, httpx.HTTPError) as exc:
            raise _failure(exc, backend=backend) from exc
        return _answer(responses, url=backend.url)

    return execute


class _Bearer(httpx.Auth):
    """The token from the Tool's Secret, read at each request (a rotated Secret takes effect without a restart)."""

    def __init__(self, *, kit: ToolKit, backend: A2ABackend) -> None:
        self._kit = kit
        self._backend = backend

    def auth_flow(self, request: httpx.Request):
        if self._backend.token is not None:
            token = self._kit.secret(self._backend.token.env)
            if token is None:
                raise ToolFailure(f"the token for the A2A agent {self._backend.url} comes from env var "
                                  f"{self._backend.token.env}, which is empty; check the Tool's "
                                  "spec.a2a.tokenSecretRef", code=ErrorCode.UNAVAILABLE)  # fmt: skip
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def _failure(exc: Exception, *, backend: A2ABackend) -> ToolFailure:
    text = str(exc)
    if _status(exc) in (401, 403):
        where = f"env var {backend.token.env}" if backend.token else "no token (the Tool names no tokenSecretRef)"
        return ToolFailure(f"the A2A agent {backend.url} refused the token ({where}): check the Tool's "
                           "spec.a2a.tokenSecretRef and the Secret behind it", code=ErrorCode.UNAVAILABLE)  # fmt: skip
    return ToolFailure(f"cannot reach the A2A agent {backend.url}: {text or type(exc).__name__}",
                       code=ErrorCode.UNAVAILABLE, retryable=True)  # fmt: skip


def _status(exc: BaseException | None) -> int | None:
    """The HTTP status behind an error (the SDK wraps httpx's status error), if it was one."""
    while exc is not None:
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code
        exc = exc.__cause__ or exc.__context__
    return None


def _answer(responses: list[Any], *, url: str) -> str:
    """The text of the last task (its artifacts, else its status message) or of the answer message."""
    for response in reversed(responses):
        if response.HasField("message"):
            return _text(response.message.parts)
        if response.HasField("task"):
            task = response.task
            said = _text(task.status.message.parts) if task.status.HasField("message") else ""
            if task.status.state in _FAILED:
                state = TaskState.Name(task.status.state).removeprefix("TASK_STATE_").lower()
                raise ToolFailure(f"the A2A agent {url} {state} the task: {said or 'it gave no reason'}",
                                  code=ErrorCode.EXECUTION_FAILED)  # fmt: skip
            return "".join(_text(artifact.parts) for artifact in task.artifacts) or said
    raise ToolFailure(f"the A2A agent {url} answered nothing", code=ErrorCode.EXECUTION_FAILED)


def _text(parts: Any) -> str:
    return "".join(part.text for part in parts if part.HasField("text"))
