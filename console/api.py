"""The run store's read API, JSON over HTTP, for the web console, `rockbot runs` and scripts.

| request                                             | answers                                   |
| --------------------------------------------------- | ----------------------------------------- |
| `GET /api/runs?namespace=N[&agent&source&outcome&session&since&until&limit&cursor]` | `RunPage`, newest first |
| `GET /api/runs/{run_id}`                            | `RunDetail`: the run and its timeline     |
| `GET /api/sessions/{namespace}/{agent}/{session}[?caller]` | `{"runs": [RunSummary...]}`, oldest first |
| `GET /api/runs/{run_id}/files`                      | `{"files": [StoredFile...]}`: what the run brought |
| `GET /api/files/{file_id}`                          | the file: a raster image inline, all else as a download |
| `POST /api/runs/{run_id}/replay` `{mode, model, system_prompt}` | `Comparison`: the run and its replay |

Who asks is the console's gate's business (`IDENTITY`, set by its middleware: a ServiceAccount or
user token, the authenticating proxy, or `rockbot local`'s one user); what they may read is the
cluster's: the runs of a namespace need `get agents` there (the same right as the Agent pages).
A run the user may not read answers 404, like one that does not exist, so ids cannot be probed; so does a file.

A file is shown inline only when its bytes are a PNG, JPEG, GIF or WebP (sniffed when it was saved, served with
that type); everything else (SVG, HTML, CSV...) is a download (`Content-Disposition: attachment`), and every file
answer carries `X-Content-Type-Options: nosniff` and a CSP that runs nothing, so no file is ever a page of the
console's origin. Its name goes in the header percent-encoded (RFC 5987), never as a path.

Replaying a run (`console.replay`) runs its Agent as the user: it needs `create agents/chat` there too, like
chatting.
"""

from __future__ import annotations

import datetime
import urllib.parse
from collections.abc import Mapping

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rockbot.console.authorization import CHAT, VIEW, Authorizer
from rockbot.console.chat import ChatFailed
from rockbot.console.file_store import FileStore
from rockbot.console.replay import Replayer, ReplayOptions, ReplayRefused
from rockbot.console.store import Store, StoreUnavailable
from rockbot.console.store_models import MAX_PAGE, BadCursor, RunDetail, RunFilter, StoredFile
from rockbot.console.web.gate import IDENTITY
from rockbot.contracts.conversations import console_caller
from rockbot.media import RASTER

STORE = web.AppKey("run_store", Store)
AUTHORIZER = web.AppKey("run_authorizer", Authorizer)
FILES = web.AppKey("run_files", FileStore)
#: Every file answer: nothing in it runs, nothing is guessed from its bytes.
FILE_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox",
                "Cache-Control": "private, no-store"}
REPLAYER = web.AppKey("run_replayer", Replayer)


def add_run_routes(app: web.Application, *, store: Store, authorizer: Authorizer,
                   replayer: Replayer | None = None) -> None:
    """Serve the read API on `app` (behind the app's gate middleware, which sets `IDENTITY`); replays with a
    `replayer` (the console's bus login)."""
    app[STORE] = store
    app[AUTHORIZER] = authorizer
    if replayer is not None:
        app[REPLAYER] = replayer
        app.router.add_post("/api/runs/{run_id}/replay", replay_run)
    app.router.add_get("/api/runs", list_runs)
    app.router.add_get("/api/runs/{run_id}", get_run)
    app.router.add_get("/api/sessions/{namespace}/{agent}/{session_id}", session_runs)
    app.router.add_get("/api/runs/{run_id}/files", run_files)


def add_file_routes(app: web.Application, *, store: Store, authorizer: Authorizer) -> None:
    """Serve a conversation's files (`GET /api/files/{id}`), for the API and the console's pages alike."""
    app[FILES] = FileStore(store=store)
    app[AUTHORIZER] = authorizer
    app.router.add_get("/api/files/{file_id}", get_file)


def _json(model: BaseModel | dict[str, object]) -> web.Response:
    text = model.model_dump_json() if isinstance(model, BaseModel) else _dump(model)
    return web.Response(text=text, content_type="application/json")


def _dump(value: dict[str, object]) -> str:
    import json

    return json.dumps(value, default=lambda item: item.model_dump(mode="json"))


async def _may_read(request: web.Request, namespace: str) -> bool:
    return await request.app[AUTHORIZER].allowed(identity=request[IDENTITY], namespace=namespace, action=VIEW)


def _bad_request(text: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=text)


def _time(query: Mapping[str, str], name: str) -> datetime.datetime | None:
    value = query.get(name)
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError as exc:
        raise _bad_request(f"{name}={value!r} is not a time: use ISO 8601, e.g. 2026-11-25T17:00:00Z") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def run_filter(query: Mapping[str, str]) -> RunFilter:
    """The filter a query string asks for (namespace, agent, source, outcome, session, since, until); 400 if invalid."""
    try:
        return RunFilter(
            namespace=query.get("namespace") or None, agent=query.get("agent") or None,
            source=query.get("source") or None, outcome=query.get("outcome") or None,  # type: ignore[arg-type]
            session_id=query.get("session") or None, since=_time(query, "since"), until=_time(query, "until"),
        )  # fmt: skip
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise _bad_request(f"invalid filter: {problems}") from exc


async def list_runs(request: web.Request) -> web.Response:
    query = request.query
    namespace = query.get("namespace", "")
    if not namespace:
        raise _bad_request("namespace is required: list the runs of one namespace (?namespace=NAME)")
    if not await _may_read(request, namespace):
        raise web.HTTPForbidden(text=f"{request[IDENTITY].username} may not get agents in namespace {namespace} "
                                "(ask for a Role granting it)")  # fmt: skip
    filters = run_filter(query)
    try:
        limit = int(query.get("limit", "50"))
    except ValueError as exc:
        raise _bad_request(f"limit={query.get('limit')!r} is not a number: use 1 to {MAX_PAGE}") from exc
    try:
        page = await request.app[STORE].list_runs(filters=filters, limit=limit, cursor=query.get("cursor") or None)
    except BadCursor as exc:
        raise _bad_request(str(exc)) from exc
    except StoreUnavailable as exc:
        raise _unreachable(exc) from exc
    return _json(page)


async def get_run(request: web.Request) -> web.Response:
    return _json(await _readable_run(request, request.match_info["run_id"]))


async def _readable_run(request: web.Request, run_id: str) -> RunDetail:
    """The run if the user may read it; a 404 otherwise, the same for a refused run as for a missing one."""
    try:
        run = await request.app[STORE].get_run(run_id)
    except StoreUnavailable as exc:
        raise _unreachable(exc) from exc
    if run is None or not await _may_read(request, run.namespace):
        raise web.HTTPNotFound(text=f"no run {run_id!r} that you may read")
    return run


def _unreachable(exc: StoreUnavailable) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(text=f"the run store is unreachable: {exc}")


async def session_runs(request: web.Request) -> web.Response:
    namespace, agent, session_id = (request.match_info[k] for k in ("namespace", "agent", "session_id"))
    if not await _may_read(request, namespace):
        raise web.HTTPForbidden(text=f"{request[IDENTITY].username} may not get agents in namespace {namespace} "
                                "(ask for a Role granting it)")  # fmt: skip
    try:
        found = await request.app[STORE].session_runs(
            namespace=namespace, agent=agent, session_id=session_id, caller=request.query.get("caller")
        )
    except StoreUnavailable as exc:
        raise _unreachable(exc) from exc
    return _json({"runs": found})


async def run_files(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    await _readable_run(request, run_id)
    try:
        files = await FileStore(store=request.app[STORE]).of_run(run_id)
    except StoreUnavailable as exc:
        raise _unreachable(exc) from exc
    return _json({"files": files})


async def get_file(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    try:
        found = await request.app[FILES].read_any(file_id)
    except StoreUnavailable as exc:
        raise _unreachable(exc) from exc
    if found is None or not await _may_read_file(request, found[0]):
        raise web.HTTPNotFound(text=f"no file {file_id!r} that you may read")
    stored, content = found
    return file_response(name=stored.name, media_type=stored.media_type, content=content)


async def _may_read_file(request: web.Request, stored: StoredFile) -> bool:
    """Whoever may read the namespace's runs, and the person whose own chat it is while they may chat there (a
    chat page shows its files to someone who may chat but not list runs)."""
    if await _may_read(request, stored.namespace):
        return True
    identity = request[IDENTITY]
    return stored.caller == console_caller(identity.username) and await request.app[AUTHORIZER].allowed(
        identity=identity, namespace=stored.namespace, action=CHAT)


def file_response(*, name: str, media_type: str, content: bytes) -> web.Response:
    """A raster image inline with its sniffed type; anything else as an attachment of its name."""
    filename = urllib.parse.quote(name.rpartition("/")[2], safe="")
    inline = media_type in RASTER
    disposition = "inline" if inline else "attachment"
    headers = {**FILE_HEADERS, "Content-Disposition": f"{disposition}; filename*=UTF-8''{filename}"}
    return web.Response(body=content, headers=headers,
                        content_type=media_type if inline else "application/octet-stream")  # fmt: skip
async def replay_run(request: web.Request) -> web.Response:
    """Replay a run the user may read, as the user (who needs the right to chat with its Agent), and compare."""
    run_id = request.match_info["run_id"]
    run = await _readable_run(request, run_id)
    identity = request[IDENTITY]
    if not await request.app[AUTHORIZER].allowed(identity=identity, namespace=run.namespace, action=CHAT):
        raise web.HTTPForbidden(text=f"{identity.username} may not {CHAT.describe()} in namespace {run.namespace}: "
                                "a replay runs the Agent as you (ask for a Role granting it)")  # fmt: skip
    try:
        options = ReplayOptions.model_validate_json(await request.text() or "{}")
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise _bad_request(f"invalid replay request: {problems} (send {{\"mode\": \"live\"|\"recorded\"}})") from exc
    try:
        comparison = await request.app[REPLAYER].replay(run, user=identity.username, options=options)
    except ReplayRefused as exc:
        raise web.HTTPConflict(text=str(exc)) from exc
    except ChatFailed as exc:
        raise web.HTTPBadGateway(text=str(exc)) from exc
    except TimeoutError as exc:
        raise web.HTTPGatewayTimeout(text=f"the replay of {run_id} ran, but its run did not reach the store in "
                                     "time: look for it with rockbot runs list --source replay") from exc
    return _json(comparison)
