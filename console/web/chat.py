"""The chat page: a person talks with an Agent they may chat with (`create agents/chat`), sees the answer as it
streams and each tool call as it starts and ends, and comes back to the conversation later (the run store
keeps it).

The page posts a turn with `fetch` (CSRF header) and reads the answer as Server-Sent Events from the same
response; the browser's script writes everything with `textContent` (a model's text is hostile input), under
the console's Content-Security-Policy (no inline script). A conversation is the session id in the page's
address, kept under the caller `console:<user>`: nobody else can open or continue it, even knowing the id.

A person attaches files to a turn: each is posted first (`POST .../chat/files?session=S`, the raw bytes, its name
in `X-File-Name`) and kept in the run store under the conversation (`upload`), within `MAX_UPLOAD_BYTES` a file and
`MAX_FILES_PER_CONVERSATION`; the turn then names them by id (at most `MAX_ATTACHED_PER_TURN`), only the
conversation's own are taken (any other id is refused as one nobody holds), the model reads their names, types and
sizes after the message, and the run the turn makes is named as the one that brought them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
import uuid
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from rockbot.console.authorization import CHAT
from rockbot.console.chat import ChatFailed, ChatRelay
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import Store, StoreUnavailable
from rockbot.console.store_models import RunFilter, StoredFile
from rockbot.console.web.gate import IDENTITY
from rockbot.console.web.pages import Pages
from rockbot.contracts.conversations import console_caller
from rockbot.contracts.files import (
    MAX_ATTACHED_PER_TURN,
    MAX_FILES_PER_CONVERSATION,
    MAX_UPLOAD_BYTES,
    NOT_FOUND,
    SavedFile,
    attachment_note,
)
from rockbot.contracts.inbox import InboxReply
from rockbot.contracts.recording import HistoryReply
from rockbot.contracts.scripts import FileId, FileName
from rockbot.media import RASTER

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
    #: Files of this conversation the person attached (posted before, by id).
    files: Annotated[list[FileId], Field(max_length=MAX_ATTACHED_PER_TURN)] = []


_FILE_NAME: TypeAdapter[str] = TypeAdapter(FileName)


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
        files = await self._shown_files(FileOwner(namespace=namespace, agent=name, caller=caller, session_id=session))
        return self._pages.render(request, "chat.html", namespace=namespace, name=name, session=session,
                                  messages=messages, new_session=new_session(), files=files, raster=RASTER,
                                  files_on=self._store is not None)  # fmt: skip

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
            owner = FileOwner(namespace=namespace, agent=name, caller=_caller(request), session_id=turn.session)
            attached = await self._attached(owner, turn.files)
            return await self._stream(request, namespace=namespace, name=name, turn=turn, conversation=conversation,
                                      owner=owner, attached=attached)  # fmt: skip
        finally:
            conversation.cancel()  # a refused turn's read is not waited for (done: nothing happens)

    async def upload(self, request: web.Request) -> web.Response:
        """Keep a file the person attaches to their next turn in this conversation; its id, name, type and size."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        await self._pages.require(request, namespace=namespace, action=CHAT)
        session = request.query.get("session", "")
        if not _valid_session(session):
            raise web.HTTPBadRequest(text="session: lower-case letters, digits and '-', at most 64")
        files = self._files()
        try:
            file_name = _FILE_NAME.validate_python(urllib.parse.unquote(request.headers.get("X-File-Name", "")))
        except ValidationError as exc:
            raise web.HTTPBadRequest(text=f"X-File-Name: {exc.errors()[0]['msg']} (send the file's name, "
                                     "percent-encoded)") from exc  # fmt: skip
        content = await _bounded_body(request)
        owner = FileOwner(namespace=namespace, agent=name, caller=_caller(request), session_id=session)
        try:
            if len(await files.conversation(owner=owner)) >= MAX_FILES_PER_CONVERSATION:
                raise web.HTTPRequestEntityTooLarge(
                    max_size=MAX_FILES_PER_CONVERSATION, actual_size=MAX_FILES_PER_CONVERSATION + 1,
                    text=f"this conversation holds {MAX_FILES_PER_CONVERSATION} files already: start a new one")
            stored = await files.save(owner=owner, name=file_name, content=content, origin="upload")
        except StoreUnavailable as exc:
            raise web.HTTPServiceUnavailable(
                text=f"the run store is unavailable; the file was not kept: {exc}") from exc
        saved = SavedFile(id=stored.id, name=stored.name, media_type=stored.media_type, size=stored.size)
        return web.json_response(text=saved.model_dump_json())

    def _files(self) -> FileStore:
        if self._store is None:
            raise web.HTTPServiceUnavailable(text="this console keeps no run store, so it keeps no files")
        return FileStore(store=self._store)

    async def _attached(self, owner: FileOwner, ids: list[str]) -> list[SavedFile]:
        """The turn's attachments, when each is the conversation's own; a 400 naming the first that is not."""
        if not ids:
            return []
        try:
            held = {file.id: file for file in await self._files().conversation(owner=owner)}
        except StoreUnavailable as exc:
            raise web.HTTPServiceUnavailable(
                text=f"the run store is unavailable; the files cannot be attached: {exc}") from exc
        for index, file_id in enumerate(ids):
            if file_id not in held:
                raise web.HTTPBadRequest(text=f"files[{index}]: {NOT_FOUND}")
        return [SavedFile(id=f.id, name=f.name, media_type=f.media_type, size=f.size) for f in map(held.get, ids)
                if f is not None]

    async def _stream(self, request: web.Request, *, namespace: str, name: str, turn: ChatTurn,
                      conversation: asyncio.Task[HistoryReply | None], owner: FileOwner,
                      attached: list[SavedFile]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})  # fmt: skip
        await response.prepare(request)
        try:
            async for step in self._relay.turn(namespace=namespace, agent=name, user=request[IDENTITY].username,
                                               session_id=turn.session,
                                               content=turn.message + attachment_note(attached),
                                               conversation=conversation):  # fmt: skip
                if isinstance(step, InboxReply):
                    if attached and step.run_id:
                        await self._bring(owner, attached, run_id=step.run_id)
                    await _event(response, "answer" if step.error is None else "error",
                                 {**_reply(step), "files": await self._made(step.run_id)})
                else:
                    await _event(response, step.kind, step.model_dump(mode="json"))
        except ChatFailed as exc:
            await _event(response, "error", {"message": str(exc)})
        except ConnectionResetError:
            log.info("the browser left before the answer of %s/%s ended", namespace, name)
            return response
        await response.write_eof()
        return response

    async def _made(self, run_id: str | None) -> list[dict[str, Any]]:
        """What the run's scripts gave back (kept by the console before the agent answered), for the answer."""
        if self._store is None or not run_id:
            return []
        try:
            made = await FileStore(store=self._store).of_run(run_id)
        except StoreUnavailable as exc:
            log.warning("the files of run %s are not shown: %s", run_id, exc)
            return []
        return [SavedFile(id=f.id, name=f.name, media_type=f.media_type, size=f.size).model_dump()
                for f in made if f.origin == "script"]

    async def _shown_files(self, owner: FileOwner) -> list[StoredFile]:
        if self._store is None:
            return []
        try:
            return await FileStore(store=self._store).conversation(owner=owner)
        except StoreUnavailable as exc:
            log.warning("the files of conversation %s are not shown: %s", owner.session_id, exc)
            return []

    async def _bring(self, owner: FileOwner, attached: list[SavedFile], *, run_id: str) -> None:
        """Name the turn's run as the one that brought its attachments (shown on its page); a store that does not
        answer leaves them the conversation's only."""
        try:
            await self._files().attach([file.id for file in attached], owner=owner, run_id=run_id)
        except StoreUnavailable as exc:
            log.warning("the attachments of run %s are not named on it: %s", run_id, exc)

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


async def _bounded_body(request: web.Request) -> bytes:
    """The request's body, refused (413, naming the bound) as soon as it passes `MAX_UPLOAD_BYTES`."""
    too_large = web.HTTPRequestEntityTooLarge(
        max_size=MAX_UPLOAD_BYTES, actual_size=request.content_length or MAX_UPLOAD_BYTES + 1,
        text=f"a file attached to a chat is at most {MAX_UPLOAD_BYTES:,} bytes: send a smaller one",
    )  # fmt: skip
    if (request.content_length or 0) > MAX_UPLOAD_BYTES:
        raise too_large
    body = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > MAX_UPLOAD_BYTES:
            raise too_large
    return bytes(body)


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
