"""`rockbot local` serves the same console as a cluster, on 127.0.0.1 only: no login (whoever reaches the
loopback port is the person at this machine), the local SQLite run store, the in-process bus.

It is the cluster's console, not a copy: the same pages, the same chat relay (turns to the agents' inboxes as
`service.console`, progress on its own reply queue) and the same approval desk (agents ask over the bus as in a
cluster). What differs is where its facts come from: the Agents, ScheduledTasks and Triggers are the manifests
`rockbot local` runs (each Agent Ready, with the tools its runtime offers), and every user may do everything.
Requests must name a loopback host (`Host: 127.0.0.1:PORT` or `localhost:PORT`), so a web page that rebinds its
own domain to 127.0.0.1 cannot drive it; state-changing requests still need the page's CSRF token (a program at
this machine, `rockbot replay`, reads it from `/api/local/csrf`). It serves the runs' JSON API too, so `rockbot
runs` and `rockbot replay` work with `--url` on it as on a cluster's console.
"""

from __future__ import annotations

import contextlib
import copy
import getpass
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import CONSOLE
from rockbot.console.api import add_run_routes
from rockbot.console.approvals import ApprovalDesk, OnPending
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import Action
from rockbot.console.chat import ChatRelay
from rockbot.console.memory_store import MemoryStore
from rockbot.console.replay import CSRF_PATH, Replayer
from rockbot.console.store import Store
from rockbot.console.web.app import Handler, build_app
from rockbot.console.web.gate import Gate
from rockbot.kube import AGENTS, SCHEDULED_TASKS, TRIGGERS, NotFound
from rockbot.kube.client import ObjectList
from rockbot.kube.resources import Resource
from rockbot.local.broker import Connect
from rockbot.local.manifests import Manifests
from rockbot.local.triggers import PortUnavailable

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_PORT = 8080


class Everyone:
    """Locally the one person at the machine may do everything the console offers."""

    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool:
        return True


class ManifestCatalog:
    """The objects the console reads (as it reads them from the API server in a cluster), from the manifests."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self._objects = objects  # by resource plural

    @classmethod
    def of(cls, *, manifests: Manifests, agents: dict[str, AgentRuntime]) -> ManifestCatalog:
        """The Agents `rockbot local` runs, each Ready with its runtime's tools, and their tasks and Triggers."""
        return cls({
            AGENTS.plural: [_agent(manifests.agents[name], runtime) for name, runtime in agents.items()],
            SCHEDULED_TASKS.plural: [_placed(body, agents) for body in manifests.tasks.values()],
            TRIGGERS.plural: [_placed(body, agents) for body in manifests.triggers.values()],
        })  # fmt: skip

    async def list(self, resource: Resource, *, namespace: str | None = None) -> ObjectList:
        items = [o for o in self._objects.get(resource.plural, [])
                 if namespace is None or o["metadata"]["namespace"] == namespace]
        return ObjectList(items=copy.deepcopy(items), resource_version="0")

    async def get(self, resource: Resource, *, namespace: str | None = None, name: str) -> dict[str, Any]:
        for found in (await self.list(resource, namespace=namespace)).items:
            if found["metadata"]["name"] == name:
                return found
        raise NotFound(status=404, reason="NotFound", message=f"{resource.plural} {name!r} is not in these files")


def _agent(body: dict[str, Any], runtime: AgentRuntime) -> dict[str, Any]:
    config = runtime.config
    agent = copy.deepcopy(body)
    agent["metadata"] = {**agent.get("metadata", {}), "namespace": config.namespace}
    agent["spec"]["model"] = {**agent["spec"].get("model", {}), "name": config.model.name}
    tools = []
    for offered in runtime.registry.openai_tools():
        function = offered["function"]
        tool = runtime.registry.get(function["name"])
        tools.append({"name": function["name"], "description": function.get("description", ""),
                      "source": str(tool.source) if tool else ""})
    agent["status"] = {"readyReplicas": 1, "tools": tools, "conditions": [
        {"type": "Ready", "status": "True", "reason": "RunningLocally", "message": "rockbot local runs it here"}]}
    return agent


def _placed(body: dict[str, Any], agents: dict[str, AgentRuntime]) -> dict[str, Any]:
    """A task or Trigger in the namespace of the Agent it names (locally one namespace per Agent's file)."""
    placed = copy.deepcopy(body)
    target = agents.get(((placed.get("spec") or {}).get("agentRef") or {}).get("name", ""))
    namespace = target.config.namespace if target else "default"
    placed["metadata"] = {**placed.get("metadata", {}), "namespace": namespace}
    return placed


def _csrf_token(sessions: Sessions) -> Handler:
    """The CSRF token of the one local user, for a program at this machine (`rockbot replay`): a page of another
    origin cannot read it (no CORS), and another host name is refused (`_loopback_host`), as for the pages that
    carry it."""

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"token": sessions.csrf_token(principal="local")})

    return answer


@web.middleware
async def _loopback_host(request: web.Request, handler: Handler) -> web.StreamResponse:
    host = (request.host or "").rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        raise web.HTTPMisdirectedRequest(text=f"this console answers only to 127.0.0.1 and localhost, not {host!r}")
    return await handler(request)


@dataclass(kw_only=True)
class LocalConsole:
    url: str
    desk: ApprovalDesk
    relay: ChatRelay


@contextlib.asynccontextmanager
async def serving(*, connect: Connect, store: Store | None, manifests: Manifests, agents: dict[str, AgentRuntime],
                  port: int = DEFAULT_PORT, on_pending: OnPending | None = None) -> AsyncIterator[LocalConsole]:
    """The console on 127.0.0.1:`port` (0: a free one) with its own bus login, until the block ends."""
    async with contextlib.AsyncExitStack() as stack:
        bus = await stack.enter_async_context(await connect(CONSOLE))
        desk = ApprovalDesk(on_pending=on_pending)
        await desk.start(bus=bus)
        stack.push_async_callback(desk.stop)
        relay = ChatRelay(store=store)
        await relay.start(bus=bus)
        stack.push_async_callback(relay.stop)
        gate = Gate(tokens=None, sessions=Sessions(), local_identity=Identity(username=f"local:{getpass.getuser()}"))
        app = build_app(gate=gate, authorizer=Everyone(), kube=ManifestCatalog.of(manifests=manifests, agents=agents),
                        desk=desk, store=store, chat=relay, secure_cookie=False,  # type: ignore[arg-type]
                        memories=store and MemoryStore(store=store))
        app.middlewares.insert(0, _loopback_host)
        if store is not None:  # the runs' API, for rockbot runs and rockbot replay --url
            add_run_routes(app, store=store, authorizer=Everyone(), replayer=Replayer(relay=relay, store=store))
        app.router.add_get(CSRF_PATH, _csrf_token(gate.sessions))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        try:
            await web.TCPSite(runner, HOST, port).start()
        except OSError as exc:
            raise PortUnavailable(f"the console cannot listen on {HOST}:{port} ({exc.strerror}): pick another with "
                                  "--console-port, or turn it off with --no-console") from None
        yield LocalConsole(url=f"http://{HOST}:{runner.addresses[0][1]}", desk=desk, relay=relay)
