"""`rockbot memories list|search|forget`: long-term memories, from a cluster's console (its JSON API) or `rockbot
local`'s SQLite.

    rockbot memories list --url https://console.example.com --token "$TOKEN"       # your own, in every Agent
    rockbot memories search deploy -n team-a --agent triage --url ... --token ...  # every caller's (agents/memories)
    rockbot memories forget m-3f2a9c0d1e2f3a4b                                       # rockbot local's, for good

With `--url` (or `$ROCKBOT_CONSOLE_URL`) the console answers as the token's user may see (`--token` or
`$ROCKBOT_CONSOLE_TOKEN`): without `-n`, that user's own memories; with it, every caller's of the namespace,
which needs `get agents/memories` there (forgetting another's, `delete agents/memories`). Without `--url`, the
SQLite file `--database` names: every memory `rockbot local` kept, the person at this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Protocol

import aiohttp

from rockbot.console.memory_store import MemoryFilter, MemoryPage, MemoryStore, StoredMemory
from rockbot.console.settings import DEFAULT_DATABASE
from rockbot.console.store import Store


class MemorySource(Protocol):
    async def list(self, *, filters: MemoryFilter, limit: int) -> MemoryPage: ...

    async def forget(self, memory_id: str) -> bool: ...

    async def close(self) -> None: ...


class HttpMemories:
    """The console's memory API (`console.memory_api`) as a user with a bearer token reads it."""

    def __init__(self, *, url: str, token: str | None) -> None:
        self._url = url.rstrip("/") + "/api/memories"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=30))

    async def list(self, *, filters: MemoryFilter, limit: int) -> MemoryPage:
        params = {"namespace": filters.namespace, "agent": filters.agent, "q": filters.text, "limit": str(limit)}
        async with self._http.get(self._url, params={k: v for k, v in params.items() if v}) as response:
            text = await response.text()
            if response.status == 404:
                raise RuntimeError(f"{self._url} is not served: is --url the console's address?")
            if response.status >= 400:
                raise RuntimeError(f"the console answered {response.status}: {text.strip()}")
            return MemoryPage.model_validate_json(text)

    async def forget(self, memory_id: str) -> bool:
        async with self._http.delete(f"{self._url}/{memory_id}") as response:
            if response.status == 404:
                return False
            if response.status >= 400:
                raise RuntimeError(f"the console answered {response.status}: {(await response.text()).strip()}")
            return True

    async def close(self) -> None:
        await self._http.close()


class LocalMemories:
    """`rockbot local`'s SQLite run store, read and written directly."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._memories = MemoryStore(store=store)

    async def list(self, *, filters: MemoryFilter, limit: int) -> MemoryPage:
        return await self._memories.list(filters=filters, limit=limit)

    async def forget(self, memory_id: str) -> bool:
        return await self._memories.delete(memory_id)

    async def close(self) -> None:
        await self._store.close()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("ROCKBOT_CONSOLE_URL"),
                        help="the console's address (default: $ROCKBOT_CONSOLE_URL; none: the local SQLite store)")
    parser.add_argument("--token", default=os.environ.get("ROCKBOT_CONSOLE_TOKEN"),
                        help="bearer token for --url (default: $ROCKBOT_CONSOLE_TOKEN)")
    parser.add_argument("--database", default=str(DEFAULT_DATABASE),
                        help=f"the SQLite run store without --url (default: {DEFAULT_DATABASE})")
    parser.add_argument("--json", action="store_true", help="print JSON as the API answers it")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, help_text in (("list", "list memories, newest first"), ("search", "memories whose text holds WORDS")):
        sub = verbs.add_parser(verb, help=help_text)
        if verb == "search":
            sub.add_argument("words", nargs="+", help="words the memory's text holds (case-insensitive)")
        sub.add_argument("-n", "--namespace", help="every caller's memories of this namespace (with --url: needs "
                                                   "get agents/memories); default: your own")  # fmt: skip
        sub.add_argument("--agent", help="only this Agent's (with -n)")
        sub.add_argument("--limit", type=int, default=50)
    forget = verbs.add_parser("forget", help="delete memories at once and for good")
    forget.add_argument("ids", nargs="+", metavar="ID", help="a memory's id, e.g. m-3f2a9c0d1e2f3a4b")


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (RuntimeError, ValueError, OSError, aiohttp.ClientError) as exc:
        print(f"rockbot memories: {exc}", file=sys.stderr)
        return 1


async def _open(args: argparse.Namespace) -> MemorySource:
    if args.url:
        return HttpMemories(url=args.url, token=args.token)
    if not await asyncio.to_thread(os.path.exists, args.database):
        raise RuntimeError(f"no run store at {args.database}: pass --url for a cluster's console, or --database")
    return LocalMemories(await Store.open(url=f"sqlite:///{args.database}", migrate=False))


async def _main(args: argparse.Namespace) -> int:
    source = await _open(args)
    try:
        if args.verb == "forget":
            missing = [memory_id for memory_id in args.ids if not await source.forget(memory_id)]
            for memory_id in args.ids:
                if memory_id not in missing:
                    print(f"forgotten {memory_id}")
            for memory_id in missing:
                print(f"rockbot memories: no memory {memory_id!r} that you may see", file=sys.stderr)
            return 1 if missing else 0
        if args.agent and not args.namespace:
            raise RuntimeError("--agent needs -n NAMESPACE (every caller's memories of that Agent)")
        filters = MemoryFilter(namespace=args.namespace, agent=args.agent,
                               text=" ".join(args.words) if args.verb == "search" else None)  # fmt: skip
        page = await source.list(filters=filters, limit=args.limit)
        print(page.model_dump_json(indent=2) if args.json else table(page.memories))
        return 0
    finally:
        await source.close()


def table(memories: list[StoredMemory]) -> str:
    lines = [f"{'REMEMBERED':17} {'AGENT':28} {'WHOSE':28} {'ID':19} TEXT"]
    for memory in memories:
        whose = memory.scope or "(shared)"
        text = " ".join(memory.text.split())
        lines.append(f"{memory.created_at:%Y-%m-%d %H:%M}  {memory.namespace + '/' + memory.agent:28} "
                     f"{whose[:28]:28} {memory.id:19} {text[:80] + ('…' if len(text) > 80 else '')}")  # fmt: skip
    if not memories:
        lines.append("(no memories)")
    return "\n".join(lines)
