"""The agent over Agent2Agent (A2A), with the official `a2a-sdk`: its agent card, `message/send`,
`message/stream` (SSE), `tasks/get` and `tasks/cancel` (and the protocol's 1.0 names of the same).

Served on the agent's one HTTP server and port, beside the OpenAI-compatible endpoint: the SDK builds
Starlette routes, and `aiohttp-asgi` mounts them in the aiohttp application at `A2A_PATH` and the card's
well-known path. So one server, one Service port, one bearer-token check (`server._bearer_auth`, which
guards `A2A_PATH` as it guards `/v1/`), and one span middleware; no second server to start and stop.

A task is one turn of the kept conversation named by the A2A `contextId` (the client sends only its new
message, as A2A does), run by `AgentRuntime.chat` like the inbox's turns: so the same daily token
budget, usage accounting and run record apply. The answer streams as chunks of the artifact `answer`
while the model writes it. The card is public, as A2A expects (it names the bearer scheme); it lists the
tools the model is offered as the agent's skills (after `conversation`, the turn itself) and the endpoint
as the request reached it.

A client's `FilePart`s (bytes inline; a part by URL is refused, nothing is fetched) are kept by the console under
the conversation (caller `a2a`, the contextId) before the turn, as a person's chat attachments are: the model
reads their names, types and sizes after the message, and scripts find them under `/input`. At most
`MAX_ATTACHED_PER_TURN` a message, `MAX_A2A_FILE_BYTES` each (one bus message carries one); over a bound, or
with nowhere to keep them, the task fails saying so. The files the turn's scripts give back come with the answer
as artifacts of their own (`file-1`, ...: the bytes, name and sniffed type; a file too large for the script's
answer, which the scripts-manager kept in the console, comes as its console link, served under the cluster's RBAC).
"""

from __future__ import annotations

import asyncio
import logging

from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from aiohttp import web
from aiohttp_asgi.resource import ASGIContext, ASGIResource
from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette

from rockbot.agent.budget import BudgetExhausted
from rockbot.agent.events import Event, TextDelta
from rockbot.agent.file_keeping import collecting_artifacts
from rockbot.agent.llm import LlmError
from rockbot.agent.runtime import AgentRuntime
from rockbot.contracts.files import (
    MAX_ATTACHED_PER_TURN,
    MAX_SENT_FILE_BYTES,
    FileContent,
    SavedFile,
    SaveFiles,
    attachment_note,
)
from rockbot.contracts.recording import new_run_id
from rockbot.contracts.scripts import FileName

log = logging.getLogger(__name__)

#: Where the JSON-RPC endpoint is served (the card names it).
A2A_PATH = "/a2a"
CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH
#: The caller of A2A conversations: every client holds the one token, so the contextId keeps them apart.
A2A_CALLER = "a2a"
ANSWER = "answer"
#: How often a stream's end of the exchange looks whether its client went away.
DISCONNECT_POLL_SECONDS = 1.0
#: The largest file a client sends: one bus message carries it to the console.
MAX_A2A_FILE_BYTES = MAX_SENT_FILE_BYTES
_FILE_NAME: TypeAdapter[str] = TypeAdapter(FileName)


class Unattached(Exception):
    """The message's files cannot be kept: the task fails with these words."""


class TurnExecutor(AgentExecutor):
    """Runs each A2A task as one turn of the conversation its contextId names."""

    def __init__(self, *, runtime: AgentRuntime, console_url: str = "") -> None:
        self.runtime = runtime
        self.console_url = console_url

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            assert context.message is not None
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        streamed = False

        async def on_event(event: Event) -> None:
            nonlocal streamed
            if isinstance(event, TextDelta) and event.text:
                await updater.add_artifact([new_text_part(event.text)], artifact_id=ANSWER, name=ANSWER,
                                           append=streamed, last_chunk=False)  # fmt: skip
                streamed = True

        try:
            # The turn's run is named first, so the message's files are kept with it (listed on its page).
            run_id = new_run_id(namespace=self.runtime.config.namespace, agent=self.runtime.config.name)
            text = context.get_user_input() + await self._attached(context.message, context_id=task.context_id,
                                                                   run_id=run_id)  # fmt: skip
            with collecting_artifacts() as made:
                result = await self.runtime.chat(task.context_id, text, caller=A2A_CALLER, on_event=on_event,
                                                 source="a2a", request_id=task.id, run_id=run_id)  # fmt: skip
        except (BudgetExhausted, LlmError, Unattached) as exc:
            await updater.failed(self._said(str(exc), task=task))
            return
        if not streamed and result.answer:
            await updater.add_artifact([new_text_part(result.answer)], artifact_id=ANSWER, name=ANSWER)
        for number, made_file in enumerate(made, start=1):
            file = made_file.artifact
            part = (Part(url=f"{self.console_url}/api/files/{file.id}", filename=file.name, media_type=file.media_type)
                    if file.id else Part(raw=file.content, filename=file.name, media_type=file.media_type))
            await updater.add_artifact([part], artifact_id=f"file-{number}", name=file.name)
        await updater.complete()

    async def _attached(self, message: Message | None, *, context_id: str, run_id: str) -> str:
        """Keep the message's files under its conversation, with the turn's run `run_id`; what the model reads of them
        after the message."""
        parts = [part for part in (message.parts if message else []) if part.WhichOneof("content") in ("raw", "url")]
        if not parts:
            return ""
        if len(parts) > MAX_ATTACHED_PER_TURN:
            raise Unattached(f"a message carries at most {MAX_ATTACHED_PER_TURN} files, not {len(parts)}")
        keeper = getattr(self.runtime.kit.sandbox, "keeper", None)
        recorder = self.runtime.recorder
        if keeper is None or recorder.record != "Full":
            raise Unattached("this agent keeps no files (it records no runs in Full, spec.runs.record): send the "
                             "content as text")  # fmt: skip
        saved: list[SavedFile] = []
        for number, part in enumerate(parts, start=1):
            if part.WhichOneof("content") == "url":
                raise Unattached(f"file {number}: a file by URL is not fetched; send its bytes (raw)")
            if len(part.raw) > MAX_A2A_FILE_BYTES:
                raise Unattached(f"file {number}: {len(part.raw):,} bytes, over the bound of {MAX_A2A_FILE_BYTES:,}")
            try:
                name = _FILE_NAME.validate_python(part.filename or f"file-{number}")
            except ValidationError as exc:
                raise Unattached(f"file {number}: filename: {exc.errors()[0]['msg']}") from None
            kept = await keeper.save(SaveFiles(origin="upload", run_id=run_id, caller=A2A_CALLER, session_id=context_id,
                                               retention_days=recorder.retention_days,
                                               files=[FileContent(name=name, content=part.raw)]))  # fmt: skip
            if kept.error:
                raise Unattached(f"file {number} ({name}) was not kept: {kept.error}")
            saved += kept.files
        return attachment_note(saved)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """The SDK has cancelled the turn's task already; say so on the task."""
        task = context.current_task
        if task is not None:
            await TaskUpdater(event_queue, task.id, task.context_id).cancel()

    @staticmethod
    def _said(text: str, *, task) -> object:
        return new_text_message(text, context_id=task.context_id, task_id=task.id, role=Role.ROLE_AGENT)


def agent_card(runtime: AgentRuntime, *, url: str) -> AgentCard:
    """The card: who the agent is, its skills (the tools the model is offered), where and how to call it."""
    config = runtime.config
    skills = [AgentSkill(id="conversation", name="conversation", tags=["chat"],
                         description="Answers a message in the conversation its contextId names, with the tools below")]
    skills += [
        AgentSkill(id=tool["function"]["name"], name=tool["function"]["name"],
                   description=tool["function"].get("description") or tool["function"]["name"], tags=["tool"])
        for tool in runtime.registry.openai_tools()
    ]  # fmt: skip
    return AgentCard(
        name=config.name,
        description=config.description or f"The rockbot agent {config.namespace}/{config.name}.",
        version="1",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="Bearer", description="The token from the Secret the Agent's operator wires"))},
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=["text/plain", "*/*"],
        default_output_modes=["text/plain", "*/*"],
        skills=skills,
    )


def mount(app: web.Application, *, runtime: AgentRuntime, console_url: str = "") -> None:
    """Serve A2A in `app` at `A2A_PATH` and the card's path, through the SDK's own request handler; files the
    scripts-manager kept are linked at the console (`console_url`)."""
    handler = DefaultRequestHandlerV2(agent_executor=TurnExecutor(runtime=runtime, console_url=console_url),
                                      task_store=InMemoryTaskStore(),
                                      agent_card=agent_card(runtime, url=A2A_PATH))  # fmt: skip

    async def card(request: web.Request) -> web.Response:
        """The card as the caller reached the agent (its Service name, a port-forward...), with today's tools."""
        return web.json_response(agent_card_to_dict(agent_card(runtime, url=f"{request.url.origin()}{A2A_PATH}")))

    app.router.add_get(CARD_PATH, card)
    starlette = Starlette(routes=create_jsonrpc_routes(handler, A2A_PATH, enable_v0_3_compat=True))
    app.router.register_resource(_Exact(starlette, path=A2A_PATH))


class _Exact(ASGIResource):
    """The ASGI application at exactly one path (aiohttp-asgi matches prefixes)."""

    def __init__(self, asgi, *, path: str) -> None:
        super().__init__(asgi, root_path="")
        self._path = path

    def raw_match(self, path: str) -> bool:
        return path == self._path

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        return await _Exchange(self._asgi_app, request, "").get_response()


class _Exchange(ASGIContext):
    """One request, whose `receive()` says `http.disconnect` once the body is read and the client has gone.

    aiohttp-asgi answers every `receive()` after the body with another empty body at once, so a server-sent
    event stream (which listens for the disconnect while it sends) would spin on it and starve the loop."""

    _body_read = False

    async def on_receive(self) -> dict:
        if not self._body_read:
            message = await super().on_receive()
            self._body_read = not message["more_body"]
            return message
        while self.request.transport is not None and not self.request.transport.is_closing():  # noqa: ASYNC110
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)  # aiohttp has no event for a client going away
        return {"type": "http.disconnect"}

