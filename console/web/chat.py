"""The chat page: a person talks with an Agent they may chat with (`create agents/chat`), sees the answer as it
streams and each tool call as it starts and ends, and comes back to the conversation later (the run store
keeps it).

The page posts a turn with `fetch` (CSRF header) and reads the answer as Server-Sent Events from the same
response; the browser's script writes everything with `textContent` (a model's text is hostile input), under
the console's Content-Security-Policy (no inline script). A conversation is the session id in the page's
address, kept under the caller `console:<user>`: nobody else can open or continue it, even knowing the id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rockbot.console.authorization import CHAT
from rockbot.console.chat import ChatFailed, ChatRelay
from rockbot.console.store import Store, StoreUnavailable
from rockbot.console.store_models import RunFilter
from rockbot.console.web.gate import IDENTITY
from rockbot.console.web.pages import Pages
from rockbot.contracts.conversations import console_caller
from rockbot.contracts.inbox import InboxReply
from rockbot.contracts.recording import HistoryReply

log = logging.getLogger(__name__)

SESSION_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
#: The longest message a person sends in one turn.
MAX_MESSAGE_CHARS = 32_000
#: Messages of the conversation shown when the page opens.
SHOWN_MESSAGES = 200


class ChatTurn(BaseModel):
    """What the page posts: the conversation and the person's message."""

    model_config = ConfigDict(extra="forbid")

    session: str = Field(pattern=SESSION_PATTERN)
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


def new_session() -> str:
    return uuid.uuid4().hex


class ChatPages:
    def __init__(self, *, pages: Pages, relay: ChatRelay, store: Store | None) -> None:
        self._pages = pages
        self._relay = relay
        self._store = store

    async def page(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        await self._pages.require(request, namespace=namespace, action=CHAT)
        caller = _caller(request)
        session = request.query.get("session", "")
        if not session:  # the person's latest conversation with this agent, or a new one
            raise web.HTTPSeeOther(location=f"{request.path}?session={await self._latest(namespace, name, caller)}")
        if not _valid_session(session):
            raise web.HTTPBadRequest(text="session: lower-case letters, digits and '-', at most 64")
        messages = await self._history(namespace=namespace, name=name, caller=caller, session=session)
        return self._pages.render(request, "chat.html", namespace=namespace, name=name, session=session,
                                  messages=messages, new_session=new_session())

    async def send(self, request: web.Request) -> web.StreamResponse:
        """Stream the answer to a posted turn. The person's conversation is read from the run store while RBAC is
        asked (a SubjectAccessReview when no answer is kept), not after: both were on the way to the first token."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        user = request[IDENTITY].username
        _caller(request)
        try:
            turn = ChatTurn.model_validate_json(await request.read())
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise web.HTTPBadRequest(text=f"invalid turn: {problems}") from exc
        conversation = self._relay.read_conversation(namespace=namespace, agent=name, user=user,
                                                     session_id=turn.session)
        try:
            await self._pages.require(request, namespace=namespace, action=CHAT)
            return await self._stream(request, namespace=namespace, name=name, turn=turn, conversation=conversation)
        finally:
            conversation.cancel()  # a refused turn's read is not waited for (done: nothing happens)

    async def _stream(self, request: web.Request, *, namespace: str, name: str, turn: ChatTurn,
                      conversation: asyncio.Task[HistoryReply | None]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})  # fmt: skip
        await response.prepare(request)
        try:
            async for step in self._relay.turn(namespace=namespace, agent=name, user=request[IDENTITY].username,
                                               session_id=turn.session, content=turn.message,
                                               conversation=conversation):  # fmt: skip
                if isinstance(step, InboxReply):
                    await _event(response, "answer" if step.error is None else "error", _reply(step))
                else:
                    await _event(response, step.kind, step.model_dump(mode="json"))
        except ChatFailed as exc:
            await _event(response, "error", {"message": str(exc)})
        except ConnectionResetError:
            log.info("the browser left before the answer of %s/%s ended", namespace, name)
            return response
        await response.write_eof()
        return response

    async def _latest(self, namespace: str, name: str, caller: str) -> str:
        if self._store is not None:
            try:
                page = await self._store.list_runs(filters=RunFilter(namespace=namespace, agent=name, caller=caller),
                                                   limit=1)  # fmt: skip
            except StoreUnavailable as exc:
                log.warning("no latest conversation with %s/%s: %s", namespace, name, exc)
            else:
                if page.runs and _valid_session(page.runs[0].session_id):
                    return page.runs[0].session_id
        return new_session()

    async def _history(self, *, namespace: str, name: str, caller: str, session: str) -> list[dict[str, Any]]:
        """The conversation as the run store keeps it: the person's and the agent's messages, with tool calls."""
        if self._store is None:
            return []
        try:
            history = await self._store.session_history(namespace=namespace, agent=name, caller=caller,
                                                        session_id=session, max_messages=SHOWN_MESSAGES)
        except StoreUnavailable as exc:
            log.warning("the conversation %s with %s/%s is not shown: %s", session, namespace, name, exc)
            return []
        shown = []
        for message in history.messages if history else []:
            role = message.get("role")
            calls = [str((c.get("function") or {}).get("name", "")) for c in message.get("tool_calls") or []]
            if role in ("user", "assistant") and (message.get("content") or calls):
                shown.append({"role": role, "content": str(message.get("content") or ""), "tools": calls})
        return shown


def _caller(request: web.Request) -> str:
    username = request[IDENTITY].username
    if "|" in username or len(username) > 200:
        raise web.HTTPForbidden(text="this user name cannot chat: it is longer than 200 characters or holds '|'")
    return console_caller(username)


def _valid_session(session: str) -> bool:
    try:
        ChatTurn(session=session, message="-")
    except ValidationError:
        return False
    return True


def _reply(reply: InboxReply) -> dict[str, Any]:
    if reply.error is not None:
        return {"message": f"{reply.error.code}: {reply.error.message}", "run_id": reply.run_id}
    return {"answer": reply.answer, "run_id": reply.run_id, "tools_called": list(reply.tools_called)}


async def _event(response: web.StreamResponse, kind: str, data: dict[str, Any]) -> None:
    await response.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
