"""The console's pages: server-rendered Jinja2 (autoescaped: whatever an agent or a model wrote is text),
a little plain JavaScript served from the package, and a strict Content-Security-Policy (no inline
script or style, nothing from another origin).

`build_app` returns an aiohttp application; `rockbot console` serves it beside the run store's JSON API.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from rockbot.console.api import add_file_routes
from rockbot.console.approvals import ApprovalDesk, UnknownApproval
from rockbot.console.auth_sessions import COOKIE_NAME, IDLE_SECONDS
from rockbot.console.authentication import Unauthenticated
from rockbot.console.authorization import APPROVE, CHAT, MEMORIES, VIEW, Authorizer
from rockbot.console.chat import ChatRelay
from rockbot.console.memory_api import add_memory_routes
from rockbot.console.memory_store import MemoryStore
from rockbot.console.replay import Replayer
from rockbot.console.store import Store, StoreUnavailable
from rockbot.console.store_models import RunFilter
from rockbot.console.web.agents import agent_page, agents_for, visible_namespaces
from rockbot.console.web.chat import ChatPages
from rockbot.console.web.gate import CSRF_PRINCIPAL, IDENTITY, Gate
from rockbot.console.web.memories import MemoryPages
from rockbot.console.web.pages import HERE, TEMPLATES, Pages, templates
from rockbot.console.web.runs import RunPages
from rockbot.kube import KubeClient

log = logging.getLogger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes browsers send `Origin: null` on our own forms
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Runs an Agent's page lists, newest first.
LAST_RUNS = 10


def build_app(
    *, gate: Gate, authorizer: Authorizer, kube: KubeClient, desk: ApprovalDesk | None = None,
    store: Store | None = None, trace_url_template: str | None = None, secure_cookie: bool = True,
    chat: ChatRelay | None = None, memories: MemoryStore | None = None,
) -> web.Application:
    """The console's pages, guarded by `gate` (who) and `authorizer` (what they may do); approvals need `desk`,
    the Runs pages the run `store`, the chat page the `chat` relay (the console's bus login), the Memories pages
    the long-term `memories` (and their JSON API comes with them)."""
    app = web.Application(middlewares=[_security_headers, gate.middleware()], client_max_size=64 * 1024)
    app[TEMPLATES] = templates()
    app[TEMPLATES].globals["approvals_on"] = desk is not None
    app[TEMPLATES].globals["runs_on"] = store is not None
    app[TEMPLATES].globals["trace_url_template"] = trace_url_template
    app[TEMPLATES].globals["chat_on"] = chat is not None
    app[TEMPLATES].globals["memories_on"] = memories is not None
    views = _Views(gate=gate, authorizer=authorizer, kube=kube, store=store, secure_cookie=secure_cookie)
    if chat is not None:
        chats = ChatPages(pages=views, relay=chat, store=store)
        app.router.add_get("/agents/{namespace}/{name}/chat", chats.page)
        app.router.add_post("/agents/{namespace}/{name}/chat", chats.send)
        app.router.add_post("/agents/{namespace}/{name}/chat/files", chats.upload)
    if desk is not None:
        approvals = _Approvals(views=views, desk=desk)
        app.router.add_get("/approvals", approvals.list)
        app.router.add_post("/approvals/{approval_id}", approvals.decide)
    if store is not None:
        runs = RunPages(pages=views, store=store, kube=kube,
                        replayer=None if chat is None else Replayer(relay=chat, store=store))
        app.router.add_get("/runs", runs.list)
        app.router.add_get("/runs/{run_id}", runs.run)
        add_file_routes(app, store=store, authorizer=authorizer)
        if chat is not None:
            app.router.add_post("/runs/{run_id}/replay", runs.replay)
    if memories is not None:
        memory_pages = MemoryPages(pages=views, memories=memories)
        app.router.add_get("/memories", memory_pages.mine)
        app.router.add_get("/agents/{namespace}/{name}/memories", memory_pages.agent)
        app.router.add_post("/memories/{memory_id}/forget", memory_pages.forget)
        add_memory_routes(app, memories=memories, authorizer=authorizer)
    app.router.add_get("/", views.home)
    app.router.add_get("/login", views.login_form)
    app.router.add_post("/login", views.login)
    app.router.add_post("/logout", views.logout)
    app.router.add_get("/agents", views.agents)
    app.router.add_get("/agents/{namespace}/{name}", views.agent)
    app.router.add_get("/healthz", views.healthz)
    app.router.add_static("/static/", HERE / "static")
    return app


@web.middleware
async def _security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(_SECURITY_HEADERS)
        raise
    if not response.prepared:  # a response with a policy of its own (a file: runs nothing at all) keeps it
        response.headers.update({k: v for k, v in _SECURITY_HEADERS.items() if k not in response.headers})
        if not request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "no-store")
    return response


class _Views(Pages):
    def __init__(self, *, gate: Gate, authorizer: Authorizer, kube: KubeClient, store: Store | None,
                 secure_cookie: bool) -> None:
        super().__init__(sessions=gate.sessions, authorizer=authorizer)
        self._gate = gate
        self._kube = kube
        self._store = store
        self._secure_cookie = secure_cookie

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def home(self, request: web.Request) -> web.Response:
        raise web.HTTPSeeOther(location="/agents")

    async def login_form(self, request: web.Request) -> web.Response:
        return self.render(request, "login.html", error=None)

    async def login(self, request: web.Request) -> web.Response:
        if self._gate.tokens is None:
            raise web.HTTPNotFound(text="this console logs users in through its authenticating proxy")
        token = str((await request.post()).get("token") or "").strip()
        try:
            identity = await self._gate.tokens.identity(token)
        except Unauthenticated as exc:
            return self.render(request, "login.html", status=401, error=str(exc))
        session = self.sessions.start(token=token, identity=identity)
        log.info("console login", extra={"user": identity.username})
        response = web.HTTPSeeOther(location="/agents")
        response.set_cookie(COOKIE_NAME, session.id, httponly=True, secure=self._secure_cookie, samesite="Strict",
                            path="/", max_age=IDLE_SECONDS)
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        principal = request.get(CSRF_PRINCIPAL)
        if principal:
            self.sessions.end(principal)
        response = web.HTTPSeeOther(location="/login")
        response.del_cookie(COOKIE_NAME, path="/")
        raise response

    async def agents(self, request: web.Request) -> web.Response:
        shown = await agents_for(kube=self._kube, identity=request[IDENTITY], authorizer=self.authorizer)
        return self.render(request, "agents.html", agents=shown)

    async def agent(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        await self.require(request, namespace=namespace, action=VIEW)
        page = await agent_page(kube=self._kube, namespace=namespace, name=name)
        if page is None:
            raise web.HTTPNotFound(text=f"no Agent {namespace}/{name}")
        last_runs = None
        if self._store is not None:
            try:
                last_runs = (await self._store.list_runs(filters=RunFilter(namespace=namespace, agent=name),
                                                         limit=LAST_RUNS)).runs
            except StoreUnavailable as exc:
                log.warning("the Agent page of %s/%s shows no runs: %s", namespace, name, exc)
        may_chat = request.app[TEMPLATES].globals["chat_on"] and await self.authorizer.allowed(
            identity=request[IDENTITY], namespace=namespace, action=CHAT)
        may_see_memories = request.app[TEMPLATES].globals["memories_on"] and await self.authorizer.allowed(
            identity=request[IDENTITY], namespace=namespace, action=MEMORIES)
        return self.render(request, "agent.html", page=page, last_runs=last_runs, may_chat=may_chat,
                           may_see_memories=may_see_memories)


class _Approvals:
    """Tool calls waiting for a person: seen with `get agents`, decided with `create agents/approve`."""

    def __init__(self, *, views: _Views, desk: ApprovalDesk) -> None:
        self._views = views
        self._desk = desk

    async def list(self, request: web.Request) -> web.Response:
        identity = request[IDENTITY]
        authorizer = self._views.authorizer
        waiting = self._desk.pending()
        visible = set(await visible_namespaces(namespaces={r.namespace for r in waiting}, identity=identity,
                                               authorizer=authorizer))
        may_approve = {ns for ns in visible
                       if await authorizer.allowed(identity=identity, namespace=ns, action=APPROVE)}
        shown = [r for r in waiting if r.namespace in visible]
        return self._views.render(request, "approvals.html", approvals=shown, may_approve=may_approve)

    async def decide(self, request: web.Request) -> web.Response:
        form = await request.post()
        verdict = str(form.get("decision") or "")
        if verdict not in ("approve", "deny"):
            raise web.HTTPBadRequest(text="decision must be approve or deny")
        try:
            pending = self._desk.get(request.match_info["approval_id"])
        except UnknownApproval:
            raise web.HTTPNotFound(text="no tool call waits under this id (decided already, or expired)") from None
        await self._views.require(request, namespace=pending.namespace, action=VIEW)
        await self._views.require(request, namespace=pending.namespace, action=APPROVE)
        try:
            await self._desk.decide(approval_id=pending.approval_id, approved=verdict == "approve",
                                    reason=str(form.get("reason") or "").strip(), decided_by=request[IDENTITY].username)
        except UnknownApproval:
            raise web.HTTPNotFound(text="no tool call waits under this id (decided already, or expired)") from None
        raise web.HTTPSeeOther(location="/approvals")
