"""The HTTP face of the emulated API server, on kmock's scaffold (discovery, request log, serving).

kmock's `KubernetesScaffold` answers discovery (`/api`, `/apis`, `/api/v1`, ...) from its
resources array, records every request in `.requests`, and `kmock.Server` serves it on
127.0.0.1. Object requests are routed here to `ApiServer`, which holds the semantics.
"""

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock

from rockbot.kube.attach import CLOSE_SIGNAL, ERROR, PROTOCOL, STDERR, STDIN, STDOUT
from tests.kubeapi.api import ApiServer, render
from tests.kubeapi.containers import Container
from tests.kubeapi.errors import StatusError, bad_request, method_not_allowed, resource_not_found
from tests.kubeapi.registry import ResourceType
from tests.kubeapi.store import Watcher

_TRUE = {"true", "True", "1"}
#: Pod subresources served besides `status`: read as the kubelet answers them, or the scheduler's binding.
_POD_SUBRESOURCES = {"log", "attach", "binding"}
_WRITES = {"POST", "PUT", "PATCH", "DELETE"}
#: How long the server waits for an attached client to close after the final Status (the real one: 15 min).
_ATTACH_FINISH_SECONDS = 10.0


@dataclass(frozen=True, kw_only=True)
class Route:
    rtype: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass(kw_only=True)
class Fault:
    """An error the emulator answers instead of serving (`KubeApiEmulator.fail`), or no answer (`.hang`)."""

    method: str
    path_suffix: str
    times: int
    error: StatusError | None  # None: hang


class EmulatorMisuse(AssertionError):
    """A test asked the emulator for something a real API server never does; raised when the emulator stops."""


@attrs.define(kw_only=True)
class KubeApiEmulator(kmock.KubernetesScaffold):
    """A Kubernetes API server in memory, over real HTTP; see the package docstring for what it does."""

    history_limit: int = 1000
    #: Seconds every request waits before it is served, as a real API server's round trip does (a few ms).
    latency: float = 0.0
    api: ApiServer = attrs.field(init=False)
    _logs: dict[tuple[str, str, str | None], str] = attrs.field(factory=dict, init=False)
    _containers: dict[tuple[str, str, str], Container] = attrs.field(factory=dict, init=False)
    _faults: list["Fault"] = attrs.field(factory=list, init=False)
    _misuses: list[str] = attrs.field(factory=list, init=False)
    _released: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.api = ApiServer(discovery=self._resources, history_limit=self.history_limit)

    # ---- for tests

    @property
    def requests(self) -> list[kmock.Request]:
        """Every request served so far, in order (kmock's log)."""
        return list(self._requests)

    def writes_since(self, mark: int = 0) -> list[kmock.Request]:
        """Write requests after the first `mark` requests (`mark = len(emulator.requests)`): what the
        scheduling and gateway benchmarks count per run."""
        return [request for request in self._requests[mark:] if str(request.method.value).upper() in _WRITES]

    def set_pod_log(self, *, namespace: str, name: str, text: str, container: str | None = None) -> None:
        """Play the kubelet: the text `pods/{name}/log` answers (for one container, or the only one)."""
        self._logs[(namespace, name, container)] = text

    def run_container(self, *, namespace: str, name: str, container: str, streams: Container) -> None:
        """Play the node's runtime: a container of a pod started; its log and attach sessions use `streams`."""
        self._containers[(namespace, name, container)] = streams

    def fail(self, *, method: str, path_suffix: str, code: int = 500, times: int = 1) -> None:
        """Answer the next `times` matching requests with an error, as an overloaded or racing server does.

        Only answers a real server gives make sense here (500, 503, 429; the request is refused before
        it changes anything). A 409 is `AlreadyExists` on a create, `Conflict` on a write with a
        resourceVersion precondition; on any other write a real server never answers 409, so the
        emulator answers 500 and raises `EmulatorMisuse` when it stops (failing the test).
        """
        reasons = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
        self._faults.append(Fault(method=method.upper(), path_suffix=path_suffix, times=times,
                                  error=StatusError(code=code, reason=reasons[code], message="injected by the test")))

    def hang(self, *, method: str, path_suffix: str, times: int = 1) -> None:
        """Answer the next `times` matching requests only at `end_watches()` (with 503), as a stuck server does."""
        self._faults.append(Fault(method=method.upper(), path_suffix=path_suffix, times=times, error=None))

    def compact(self) -> None:
        """Compact the history (as etcd does every few minutes): resuming a watch from before now gets 410."""
        self.api.store.compact()

    def end_watches(self) -> None:
        """End every open watch stream and attach session (and answer hung requests 503), as a restarting
        API server does."""
        self.api.store.end_watches()
        self._released.set()
        self._released = asyncio.Event()

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        await super().__aexit__(exc_type, exc_value, traceback)
        if self._misuses and exc_value is None:
            raise EmulatorMisuse("; ".join(self._misuses))

    # ---- serving

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Record and serve one request (kmock's entry point, tolerant of paths its parser rejects)."""
        body = await raw_request.read()
        try:
            request = await kmock.Request._parse(raw_request, id=len(self._requests))
        except ValueError:  # kmock's path parser fails on `/api/v1/namespaces` itself
            request = kmock.Request(
                id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
                params=dict(raw_request.query), headers=dict(raw_request.headers), body=body,
                text=body.decode(errors="replace"),
            )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Exception as exc:
            if self._errors:
                self._errors[-1].append(exc)
            return await self._render_error(exc)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        if self.latency:
            await asyncio.sleep(self.latency)
        try:
            for fault in self._faults:
                if fault.times and raw.method == fault.method and raw.path.endswith(fault.path_suffix):
                    fault.times -= 1
                    await self._inject(fault, request)
            route = self._route(raw.path)
            if route is None:
                return await super()._handle(request)
            return await self._serve(request, raw, route)
        except StatusError as exc:
            return exc.response()

    async def _inject(self, fault: Fault, request: kmock.Request) -> None:
        if fault.error is None:
            await self._released.wait()
            raise StatusError(code=503, reason="ServiceUnavailable", message="the emulator is stopping")
        if fault.error.code != 409:
            raise fault.error
        if fault.method == "POST":
            raise StatusError(code=409, reason="AlreadyExists", message="injected by the test: the name is taken")
        if _has_precondition(fault.method, _body(request)):
            raise fault.error
        misuse = (f"fail(code=409) matched {fault.method} {fault.path_suffix}, which has no resourceVersion "
                  "precondition: a real server never answers 409 to it; inject 500, 503 or 429 instead")
        self._misuses.append(misuse)
        raise StatusError(code=500, reason="InternalError", message=misuse)

    def _route(self, path: str) -> Route | None:
        parts = [part for part in path.split("/") if part]
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None  # discovery and other non-resource paths
        namespace = None
        namespace_subresource = group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
        if rest[0] == "namespaces" and len(rest) >= 3 and not namespace_subresource:
            namespace, rest = rest[1], rest[2:]
        rtype = self.api.registry.find(group=group, version=version, plural=rest[0])
        if rtype is None or len(rest) > 3 or (namespace is not None and not rtype.namespaced):
            raise resource_not_found()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and not (
            (subresource == "status" and rtype.has_status)
            or (rtype.key == ("", "pods") and subresource in _POD_SUBRESOURCES)
        ):
            raise resource_not_found()
        return Route(rtype=rtype, version=version, namespace=namespace, name=name, subresource=subresource)

    async def _serve(self, request: kmock.Request, raw: aiohttp.web.BaseRequest, route: Route) -> Any:
        method = raw.method.upper()
        params = raw.query
        api, rtype = self.api, route.rtype
        if method == "GET" and params.get("watch") in _TRUE:
            return await self._watch(raw, route)
        if method == "GET" and route.subresource == "log":
            return self._log(route, params)
        if route.subresource == "attach":
            return await self._attach(raw, route)
        if method == "POST" and route.subresource == "binding":
            assert route.namespace is not None and route.name is not None
            self.api.bind(rtype, namespace=route.namespace, name=route.name, body=_body(request))
            return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
                         status=201)
        if method == "GET" and route.name is not None:
            obj = api.get(rtype, namespace=route.namespace, name=route.name)
            return _json(render(rtype, route.version, obj))
        if method == "GET":
            limit = params.get("limit")
            items, rv, token = api.list_objects(
                rtype,
                namespace=route.namespace,
                label_selector=params.get("labelSelector"),
                field_selector=params.get("fieldSelector"),
                limit=int(limit) if limit and limit.isdigit() else None,
                continue_token=params.get("continue"),
            )
            meta: dict[str, Any] = {"resourceVersion": rv}
            if token:
                meta["continue"] = token
            return _json({
                "apiVersion": rtype.api_version(route.version),
                "kind": f"{rtype.kind}List",
                "metadata": meta,
                "items": [render(rtype, route.version, obj) for obj in items],
            })
        if params.get("dryRun"):
            raise bad_request("the emulator does not implement dryRun")
        body = _body(request)
        if method == "POST" and route.name is None:
            obj = api.create(rtype, version=route.version, namespace=route.namespace, body=body)
            return _json(render(rtype, route.version, obj), status=201)
        if route.name is None:
            if method == "DELETE":
                raise method_not_allowed("the emulator does not implement deletecollection")
            raise method_not_allowed(f"{method} is not allowed on a collection")
        if method == "PUT":
            obj = api.replace(rtype, version=route.version, namespace=route.namespace, name=route.name,
                              body=body, subresource=route.subresource)
            return _json(render(rtype, route.version, obj))
        if method == "PATCH":
            obj = api.patch(rtype, version=route.version, namespace=route.namespace, name=route.name,
                            content_type=raw.headers.get("Content-Type", ""), patch=body,
                            subresource=route.subresource)
            return _json(render(rtype, route.version, obj))
        if method == "DELETE" and route.subresource is None:
            options = dict(body) if isinstance(body, dict) else {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in params:
                    options.setdefault(key, params[key])
            obj = api.delete(rtype, namespace=route.namespace, name=route.name, options=options)
            return _json(render(rtype, route.version, obj))
        raise method_not_allowed(f"{method} is not allowed here")

    def _log(self, route: Route, params: Any) -> aiohttp.web.Response:
        assert route.name is not None and route.namespace is not None
        pod = self.api.get(route.rtype, namespace=route.namespace, name=route.name)
        if params.get("follow") in _TRUE:
            raise bad_request("the emulator does not implement follow=true for logs")
        container = self._container_name(route, pod, params.get("container"))
        streams = self._containers.get((route.namespace, route.name, container))
        text = streams.log.decode(errors="replace") if streams is not None else None
        if text is None:
            text = self._logs.get((route.namespace, route.name, container))
        if text is None:
            text = self._logs.get((route.namespace, route.name, None))
        if text is None:
            raise bad_request(f'container "{container}" in pod "{route.name}" is waiting to start: '
                              "ContainerCreating")
        tail = params.get("tailLines")
        if tail is not None and tail.isdigit():
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail):]) if int(tail) else ""
        limit = params.get("limitBytes")
        if limit is not None:
            if not limit.isdigit() or int(limit) < 1:
                raise bad_request(f"limitBytes: Invalid value: {limit}: must be greater than 0")
            text = text.encode()[:int(limit)].decode(errors="ignore")
        return aiohttp.web.Response(text=text, content_type="text/plain")

    def _container_name(self, route: Route, pod: dict[str, Any], container: str | None) -> str:
        """The container a log or attach request means, checked as the API server checks it."""
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        if container is None and len(names) > 1:
            raise bad_request(f"a container name must be specified for pod {route.name}, choose one of: "
                              f"[{' '.join(names)}]")
        if container is not None and container not in names:
            raise bad_request(f"container {container} is not valid for pod {route.name}")
        return container or names[0]

    async def _attach(self, raw: aiohttp.web.BaseRequest, route: Route) -> aiohttp.web.StreamResponse:
        """`pods/attach` as the API server serves a WebSocket client since 1.30 (see rockbot/kube/attach.py).

        Before the upgrade: 404 for a missing pod, 400 for a bad container or a pod not yet bound to a
        node, 400 for a request that is not a WebSocket upgrade. After it: the empty opening message,
        stdin passed to the container, its output while attached, and the final Status on channel 3
        (a container that is not running answers Failure there, as the kubelet's refusal does).
        """
        assert route.name is not None and route.namespace is not None
        pod = self.api.get(route.rtype, namespace=route.namespace, name=route.name)
        params = raw.query
        container = self._container_name(route, pod, params.get("container"))
        if not (pod.get("spec") or {}).get("nodeName"):
            raise bad_request(f"pod {route.name} does not have a host assigned")
        if raw.headers.get("Upgrade", "").lower() != "websocket":
            raise bad_request("Upgrade request required")
        offered = [p.strip() for p in raw.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if PROTOCOL not in offered:  # a real server hands older protocols to the kubelet's own WebSocket server
            raise bad_request(f"the emulator serves attach over {PROTOCOL} only, offered: {offered}")
        stdin, stdout, stderr = (params.get(key) in _TRUE for key in ("stdin", "stdout", "stderr"))
        ws = aiohttp.web.WebSocketResponse(protocols=(PROTOCOL,))
        await ws.prepare(raw)
        await ws.send_bytes(bytes([STDOUT if stdout else STDERR if stderr else ERROR]))
        streams = self._containers.get((route.namespace, route.name, container))
        if streams is None or not streams.running:
            status = StatusError(code=500, reason="InternalError", message=(
                f'Internal error occurred: unable to upgrade connection: container not found ("{container}")'
            )).status()
        else:
            status = await self._pump(ws, streams, stdin=stdin, stdout=stdout, stderr=stderr)
        if status is None:  # the server stops: the connection just drops
            await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)
        elif not ws.closed:
            with contextlib.suppress(ConnectionResetError):
                await ws.send_bytes(bytes([ERROR]) + json.dumps(status).encode())
            async with asyncio.timeout(_ATTACH_FINISH_SECONDS):
                await ws.close()
        return ws

    async def _pump(self, ws: aiohttp.web.WebSocketResponse, streams: Container, *, stdin: bool, stdout: bool,
                    stderr: bool) -> dict[str, Any] | None:
        """Carry one attach session until the container's output ends or the client goes.

        None when the server goes away (`end_watches()`): the connection drops with no Status.
        """
        queue = streams.attach()
        stopping = asyncio.ensure_future(self._released.wait())

        async def from_client() -> None:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                data = bytes(message.data)
                if data[0] == CLOSE_SIGNAL and data[1:] == bytes([STDIN]):
                    streams.close_stdin()
                elif data[0] == STDIN and stdin:
                    await streams.write_stdin(data[1:])

        reader = asyncio.create_task(from_client())
        getting: asyncio.Future[Any] | None = None
        try:
            while True:
                getting = asyncio.ensure_future(queue.get())
                await asyncio.wait({getting, reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if stopping.done():
                    return None
                if not getting.done():  # the client went away
                    break
                chunk = getting.result()
                if chunk is None:
                    break
                channel, data = chunk
                if (channel == STDOUT and stdout) or (channel == STDERR and stderr):
                    with contextlib.suppress(ConnectionResetError):
                        await ws.send_bytes(bytes([channel]) + data)
        finally:
            for task in (reader, getting, stopping):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            streams.detach(queue)
        return {"metadata": {}, "status": "Success"}

    async def _watch(self, raw: aiohttp.web.BaseRequest, route: Route) -> aiohttp.web.StreamResponse:
        params = raw.query
        field_selector = params.get("fieldSelector")
        if route.name is not None:  # the old-style watch of one object
            by_name = f"metadata.name={route.name}"
            field_selector = f"{field_selector},{by_name}" if field_selector else by_name
        matches = self.api.matcher(route.rtype, namespace=route.namespace,
                                   label_selector=params.get("labelSelector"), field_selector=field_selector)
        watcher = Watcher(key=route.rtype.key, matches=matches)
        timeout = params.get("timeoutSeconds")
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        try:
            initial = self.api.watch(watcher, resource_version=params.get("resourceVersion"))
        except StatusError as exc:
            if exc.code != 410:
                raise
            await response.prepare(raw)
            await self._send(response, route, "ERROR", exc.status())
            await response.write_eof()
            return response
        try:
            await response.prepare(raw)
            async with asyncio.timeout(float(timeout) if timeout else None):
                for type_, obj in initial:
                    await self._send(response, route, type_, obj)
                while (change := await watcher.queue.get()) is not None:
                    event = watcher.translate(change)
                    if event is not None:
                        await self._send(response, route, *event)
        except TimeoutError:
            pass
        finally:
            self.api.store.unsubscribe(watcher)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def _send(self, response: aiohttp.web.StreamResponse, route: Route, type_: str, obj: Any) -> None:
        payload = obj if type_ == "ERROR" else render(route.rtype, route.version, obj)
        await response.write(json.dumps({"type": type_, "object": payload}).encode() + b"\n")


def _json(obj: Any, *, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(status=status, text=json.dumps(obj), content_type="application/json")


def _has_precondition(method: str, body: Any) -> bool:
    """Whether a write is conditional on a resourceVersion, the only kind a real server answers 409 Conflict."""
    if method == "PATCH" and isinstance(body, list):  # JSON patch: a test of the resourceVersion
        return any(op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion" for op in body)
    if not isinstance(body, dict):
        return False
    if method == "DELETE":
        return bool((body.get("preconditions") or {}).get("resourceVersion"))
    return bool((body.get("metadata") or {}).get("resourceVersion"))


def _body(request: kmock.Request) -> Any:
    if not request.body:
        return None
    try:
        return json.loads(request.body)
    except ValueError as exc:
        raise bad_request(f"the request body is not JSON: {exc}") from exc

