"""Long-term memories as JSON over HTTP, for `rockbot memories` and scripts; the same rules as the Memories pages.

| request                                                | answers                                         |
| ------------------------------------------------------ | ----------------------------------------------- |
| `GET /api/memories[?q&limit&cursor]`                   | `MemoryPage`: the user's own memories, newest first |
| `GET /api/memories?namespace=N[&agent&q&limit&cursor]` | `MemoryPage`: every caller's (`get agents/memories` in N) |
| `DELETE /api/memories/{id}`                            | `{"forgotten": id}`: deleted at once and for good |

A memory the user may not see answers 404, like one that does not exist.
"""

from __future__ import annotations

import json

from aiohttp import web

from rockbot.console.authorization import MEMORIES, Authorizer
from rockbot.console.memory_store import MemoryFilter, MemoryStore
from rockbot.console.store_models import MAX_PAGE
from rockbot.console.web.gate import IDENTITY
from rockbot.console.web.memories import forget, listed
from rockbot.contracts.conversations import console_caller

MEMORY_STORE = web.AppKey("memory_store", MemoryStore)
MEMORY_AUTHORIZER = web.AppKey("memory_authorizer", Authorizer)


def add_memory_routes(app: web.Application, *, memories: MemoryStore, authorizer: Authorizer) -> None:
    """Serve the memory API on `app` (behind the app's gate middleware, which sets `IDENTITY`)."""
    app[MEMORY_STORE] = memories
    app[MEMORY_AUTHORIZER] = authorizer
    app.router.add_get("/api/memories", list_memories)
    app.router.add_delete("/api/memories/{memory_id}", forget_memory)


async def list_memories(request: web.Request) -> web.Response:
    query, identity = request.query, request[IDENTITY]
    try:
        limit = int(query.get("limit", "50"))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"limit={query.get('limit')!r} is not a number: use 1 to {MAX_PAGE}") from exc
    namespace = query.get("namespace") or None
    if namespace is None:
        if query.get("agent"):
            raise web.HTTPBadRequest(text="agent needs namespace: every caller's memories of one Agent "
                                     "(?namespace=N&agent=A); without either, your own")  # fmt: skip
        filters = MemoryFilter(caller=console_caller(identity.username), text=query.get("q") or None)
    else:
        if not await request.app[MEMORY_AUTHORIZER].allowed(identity=identity, namespace=namespace, action=MEMORIES):
            raise web.HTTPForbidden(text=f"{identity.username} may not get agents/memories in namespace {namespace} "
                                    "(ask for a Role granting it)")  # fmt: skip
        filters = MemoryFilter(namespace=namespace, agent=query.get("agent") or None, text=query.get("q") or None)
    page = await listed(request.app[MEMORY_STORE], filters=filters, limit=limit, cursor=query.get("cursor") or None)
    return web.Response(text=page.model_dump_json(), content_type="application/json")


async def forget_memory(request: web.Request) -> web.Response:
    memory = await forget(request.app[MEMORY_STORE], identity=request[IDENTITY],
                          memory_id=request.match_info["memory_id"], authorizer=request.app[MEMORY_AUTHORIZER])
    return web.Response(text=json.dumps({"forgotten": memory.id}), content_type="application/json")
