"""The Memories pages: each person's own long-term memories, and an Agent's (every caller's) for those allowed.

Memories are about people, so people own theirs: whatever an agent remembered of what a person told it in the
console (its caller `console:<user>`) that person sees, searches and forgets here with no right at all, in
every Agent. An Agent's page of memories shows every caller's to those who may `get agents/memories` in its
namespace, and lets those who may `delete agents/memories` there forget any. Forgetting deletes the memory at
once and for good; a memory the user may not see answers 404, like one that does not exist. The JSON API
(`console.memory_api`) follows the same rules (`visible`, `may_forget`).
"""

from __future__ import annotations

from urllib.parse import urlencode

from aiohttp import web

from rockbot.console.authentication import Identity
from rockbot.console.authorization import FORGET, MEMORIES, Authorizer
from rockbot.console.memory_store import MemoryFilter, MemoryPage, MemoryStore, StoredMemory
from rockbot.console.store import StoreUnavailable
from rockbot.console.store_models import BadCursor
from rockbot.console.web.gate import IDENTITY
from rockbot.console.web.pages import Pages
from rockbot.contracts.conversations import console_caller

PAGE = 50


async def may_forget(*, identity: Identity, memory: StoredMemory, authorizer: Authorizer) -> bool:
    """A person forgets their own memories, and any of a namespace where they may `delete agents/memories`."""
    if memory.caller == console_caller(identity.username):
        return True
    return await authorizer.allowed(identity=identity, namespace=memory.namespace, action=FORGET)


async def may_see(*, identity: Identity, memory: StoredMemory, authorizer: Authorizer) -> bool:
    if memory.caller == console_caller(identity.username):
        return True
    return await authorizer.allowed(identity=identity, namespace=memory.namespace, action=MEMORIES)


async def listed(memories: MemoryStore, *, filters: MemoryFilter, limit: int, cursor: str | None) -> MemoryPage:
    """A page of memories, the store's failures as HTTP answers."""
    try:
        return await memories.list(filters=filters, limit=limit, cursor=cursor)
    except BadCursor as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    except StoreUnavailable as exc:
        raise web.HTTPServiceUnavailable(text=f"the run store is unreachable: {exc}") from exc


async def forget(memories: MemoryStore, *, identity: Identity, memory_id: str, authorizer: Authorizer) -> StoredMemory:
    """Delete a memory the person may forget (404 for one they may not see, 403 for one they only see)."""
    try:
        memory = await memories.get(memory_id)
        if memory is None or not await may_see(identity=identity, memory=memory, authorizer=authorizer):
            raise web.HTTPNotFound(text=f"no memory {memory_id!r} that you may see")
        if not await may_forget(identity=identity, memory=memory, authorizer=authorizer):
            raise web.HTTPForbidden(text=f"{identity.username} may not delete agents/memories in namespace "
                                    f"{memory.namespace} (ask for a Role granting it)")  # fmt: skip
        await memories.delete(memory_id)
    except StoreUnavailable as exc:
        raise web.HTTPServiceUnavailable(text=f"the run store is unreachable: {exc}") from exc
    return memory


class MemoryPages:
    def __init__(self, *, pages: Pages, memories: MemoryStore) -> None:
        self._pages = pages
        self._memories = memories

    async def mine(self, request: web.Request) -> web.Response:
        """The person's own memories, in every Agent."""
        identity: Identity = request[IDENTITY]
        query = request.query
        page = await listed(self._memories, filters=MemoryFilter(caller=console_caller(identity.username),
                                                                 text=query.get("q") or None),
                            limit=PAGE, cursor=query.get("cursor") or None)  # fmt: skip
        return self._render(request, page, heading="Your memories", agent=None, may_forget_all=True)

    async def agent(self, request: web.Request) -> web.Response:
        """An Agent's memories, every caller's."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        await self._pages.require(request, namespace=namespace, action=MEMORIES)
        query = request.query
        page = await listed(self._memories, filters=MemoryFilter(namespace=namespace, agent=name,
                                                                 text=query.get("q") or None),
                            limit=PAGE, cursor=query.get("cursor") or None)  # fmt: skip
        may_forget_all = await self._pages.authorizer.allowed(identity=request[IDENTITY], namespace=namespace,
                                                              action=FORGET)  # fmt: skip
        return self._render(request, page, heading=f"Memories of {namespace}/{name}", agent=(namespace, name),
                            may_forget_all=may_forget_all)  # fmt: skip

    async def forget(self, request: web.Request) -> web.Response:
        memory = await forget(self._memories, identity=request[IDENTITY], memory_id=request.match_info["memory_id"],
                              authorizer=self._pages.authorizer)  # fmt: skip
        back = str((await request.post()).get("back") or "/memories")
        if not back.startswith("/") or back.startswith("//"):
            back = "/memories"
        raise web.HTTPSeeOther(location=f"{back}{'&' if '?' in back else '?'}forgotten={memory.id}")

    def _render(self, request: web.Request, page: MemoryPage, *, heading: str, agent: tuple[str, str] | None,
                may_forget_all: bool) -> web.Response:  # fmt: skip
        identity: Identity = request[IDENTITY]
        mine = console_caller(identity.username)
        forgettable = {m.id for m in page.memories if may_forget_all or m.caller == mine}
        searched = request.query.get("q", "")
        next_query = {"q": searched, "cursor": page.next_cursor} if page.next_cursor else None
        here = f"{request.path}?{urlencode({'q': searched})}" if searched else request.path
        return self._pages.render(request, "memories.html", memories=page.memories, heading=heading, agent=agent,
                                  query=searched, forgettable=forgettable, next_query=next_query,
                                  forgotten=request.query.get("forgotten"), here=here)  # fmt: skip
