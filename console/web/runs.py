"""The Runs pages: a namespace's runs with filters, a page at a time, and one run with its whole timeline.

Both read the run store the JSON API reads, with the same rule: a namespace's runs need `get agents` there,
and a run the user may not read answers 404, like one that does not exist. A run's page shows the files it brought:
raster images inline (served by `GET /api/files/{id}` with their sniffed type), everything else as a download.
With the chat relay, a run's page has a Replay button for those who may chat with its Agent (`create agents/chat`):
the run again in recorded mode (`console.replay`), and the page that answers compares the two runs side by side.
"""

from __future__ import annotations

from aiohttp import web

from rockbot.console.api import run_filter
from rockbot.console.authorization import CHAT, VIEW
from rockbot.console.chat import ChatFailed
from rockbot.console.file_store import FileStore
from rockbot.console.replay import Replayer, ReplayOptions, ReplayRefused
from rockbot.console.store import Store, StoreUnavailable
from rockbot.console.store_models import BadCursor, RunDetail
from rockbot.console.web.agents import visible_namespaces
from rockbot.console.web.gate import IDENTITY
from rockbot.console.web.pages import Pages
from rockbot.contracts.recording import RunOutcome, RunSource
from rockbot.kube import AGENTS, KubeClient
from rockbot.media import RASTER

SOURCES: tuple[str, ...] = RunSource.__args__
OUTCOMES: tuple[str, ...] = RunOutcome.__args__
PAGE = 50


class RunPages:
    def __init__(self, *, pages: Pages, store: Store, kube: KubeClient, replayer: Replayer | None = None) -> None:
        self._pages = pages
        self._store = store
        self._kube = kube
        self._replayer = replayer

    async def list(self, request: web.Request) -> web.Response:
        pages = self._pages
        everything = {str(a["metadata"].get("namespace", "")) for a in (await self._kube.list(AGENTS)).items}
        query = dict(request.query)
        namespaces = await visible_namespaces(namespaces=everything | ({query["namespace"]} if query.get("namespace")
                                                                       else set()),
                                              identity=request[IDENTITY], authorizer=pages.authorizer)
        if not query.get("namespace") and namespaces:
            query["namespace"] = namespaces[0]
        runs, next_cursor = [], None
        if query.get("namespace"):
            await pages.require(request, namespace=query["namespace"], action=VIEW)
            try:
                page = await self._store.list_runs(filters=run_filter(query), limit=PAGE,
                                                   cursor=query.get("cursor") or None)
            except BadCursor as exc:
                raise web.HTTPBadRequest(text=str(exc)) from exc
            except StoreUnavailable as exc:
                raise web.HTTPServiceUnavailable(text=f"the run store is unreachable: {exc}") from exc
            runs, next_cursor = page.runs, page.next_cursor
        next_query = {**{k: v for k, v in query.items() if v and k != "cursor"}, "cursor": next_cursor or ""}
        return pages.render(request, "runs.html", runs=runs, namespaces=namespaces, query=query,
                            sources=SOURCES, outcomes=OUTCOMES, next_query=next_query if next_cursor else None)

    async def run(self, request: web.Request) -> web.Response:
        run = await self._readable(request)
        replay_on = self._replayer is not None and await self._pages.authorizer.allowed(
            identity=request[IDENTITY], namespace=run.namespace, action=CHAT)
        try:
            files = await FileStore(store=self._store).of_run(run.run_id)
        except StoreUnavailable as exc:
            raise web.HTTPServiceUnavailable(text=f"the run store is unreachable: {exc}") from exc
        return self._pages.render(request, "run.html", run=run, replay_on=replay_on, files=files, raster=RASTER)

    async def replay(self, request: web.Request) -> web.Response:
        """Replay the run in recorded mode as the user, and show both runs side by side."""
        assert self._replayer is not None
        run = await self._readable(request)
        await self._pages.require(request, namespace=run.namespace, action=CHAT)
        try:
            comparison = await self._replayer.replay(run, user=request[IDENTITY].username,
                                                     options=ReplayOptions(mode="recorded"))
        except (ReplayRefused, ChatFailed, TimeoutError) as exc:
            return self._pages.render(request, "replay.html", status=409 if isinstance(exc, ReplayRefused) else 502,
                                      run=run, comparison=None, error=str(exc) or "the replay was not recorded in "
                                      "time: look for it among the runs of source replay")  # fmt: skip
        return self._pages.render(request, "replay.html", run=run, comparison=comparison, error=None)

    async def _readable(self, request: web.Request) -> RunDetail:
        run_id = request.match_info["run_id"]
        try:
            run: RunDetail | None = await self._store.get_run(run_id)
        except StoreUnavailable as exc:
            raise web.HTTPServiceUnavailable(text=f"the run store is unreachable: {exc}") from exc
        authorizer = self._pages.authorizer
        if run is None or not await authorizer.allowed(identity=request[IDENTITY], namespace=run.namespace,
                                                       action=VIEW):
            raise web.HTTPNotFound(text=f"no run {run_id!r} that you may read")
        return run
