"""`KubeClient`: the verbs of the Kubernetes REST API on plain dicts, over kubernetes_asyncio's transport.

kubernetes_asyncio loads the configuration (kubeconfig or the pod's service account) and owns the
HTTP session with its TLS and token refresh; this client only builds URLs, sends JSON and maps
`Status` answers to exceptions. No retries here: callers decide what a 409 or a 410 means.

Every request has a deadline, so a hung API server cannot hold a caller (and the lock it holds)
forever: `request_timeout` (default 30 s, `$ROCKBOT_KUBE_TIMEOUT_SECONDS`) bounds each request
but a watch, and a timeout or a broken connection raises `Unavailable` (an `ApiError`, status 504
or 503). The deadline is the API server's, never the client's own queue: at most `max_in_flight`
requests (default 32) are on the wire at once, the others wait for their turn untimed, and the
connection pool has no limit of its own (long-lived watches would otherwise take its places and
leave requests timing out while they wait for a connection, which the server never saw).
A watch may wait for its `timeoutSeconds` plus `request_timeout` between two lines before
aiohttp's `ServerTimeoutError` (a `ClientError`) ends it, as any broken stream does.
"""

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urlencode

import aiohttp
import aiohttp.helpers
import yaml
import yarl
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from rockbot.kube.attach import PROTOCOL, PROTOCOL_V4, AttachSession
from rockbot.kube.errors import ApiError, KubeConfigError, Unavailable, error_from_status, error_from_text
from rockbot.kube.resources import PODS, Resource

K8sObject = dict[str, Any]
"""One API object (or a `Status`) as the API server speaks it: camelCase JSON."""

PatchType = Literal["merge", "json"]
Query = list[tuple[str, str]]
JsonPatch = list[K8sObject]

DEFAULT_REQUEST_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_IN_FLIGHT = 32
TIMEOUT_VARIABLE = "ROCKBOT_KUBE_TIMEOUT_SECONDS"
_CONNECT_TIMEOUT_SECONDS = 30.0

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
}


@dataclass(frozen=True, kw_only=True)
class ObjectList:
    """A list answer: the items and the resourceVersion to start a watch from without missing anything."""

    items: list[K8sObject]
    resource_version: str


@dataclass(frozen=True, kw_only=True)
class WatchEvent:
    """One line of a watch stream: ADDED, MODIFIED, DELETED or BOOKMARK, and the object."""

    type: str
    object: K8sObject


class KubeClient:
    """An async client for the Kubernetes API speaking plain dicts; use `async with` or `close()`."""

    def __init__(
        self,
        *,
        api_client: k8s_client.ApiClient,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be a positive number of seconds, not {request_timeout!r}")
        self._api = api_client
        self._request_timeout = request_timeout
        #: The namespace the kubeconfig's context names (None: it names none, or in a cluster).
        self.context_namespace: str | None = None
        self._turns = asyncio.Semaphore(max_in_flight)
        _settle_proxy(api_client)

    @classmethod
    async def from_environment(
        cls, *, request_timeout: float | None = None, config_file: str | None = None, context: str | None = None
    ) -> Self:
        """Connect as the pod's service account when in a cluster, else with the current kubeconfig context.

        `$KUBECONFIG` and `$ROCKBOT_KUBE_TIMEOUT_SECONDS` are read now (not when kubernetes_asyncio
        was imported), so tests and tools that point them elsewhere at runtime are honoured; a command's
        `--kubeconfig` and `--context` (`config_file`, `context`) win over both, as with kubectl.
        `KubeConfigError` says what is missing or broken and how to fix it.
        """
        if request_timeout is None:
            request_timeout = _timeout_from_environment()
        configuration = k8s_client.Configuration()
        namespace = None
        if os.environ.get("KUBERNETES_SERVICE_HOST") and config_file is None and context is None:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except k8s_config.ConfigException as exc:
                raise KubeConfigError(
                    f"in-cluster configuration failed ({exc}): mount the pod's service account token, "
                    "or unset KUBERNETES_SERVICE_HOST to use a kubeconfig"
                ) from exc
        else:
            config_file = config_file or os.environ.get("KUBECONFIG") or "~/.kube/config"
            if not await asyncio.to_thread(_any_file, config_file):
                raise KubeConfigError(
                    f"no kubeconfig file at {config_file}: set KUBECONFIG to your cluster's kubeconfig "
                    "(or run inside a cluster, with a service account)"
                )
            try:
                loader = await k8s_config.load_kube_config(
                    config_file=config_file, context=context, client_configuration=configuration, persist_config=False
                )
                namespace = ((loader.current_context or {}).get("context") or {}).get("namespace")
            except (k8s_config.ConfigException, yaml.YAMLError, ValueError, OSError) as exc:
                raise KubeConfigError(
                    f"the kubeconfig {config_file} is not usable ({' '.join(str(exc).split())}): "
                    "fix it, or set KUBECONFIG to another"
                ) from exc
        configuration.connection_pool_maxsize = 0  # no limit: see the module docstring
        client = cls(api_client=k8s_client.ApiClient(configuration), request_timeout=request_timeout)
        client.context_namespace = namespace
        return client

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session."""
        await self._api.close()

    @property
    def host(self) -> str:
        """The API server's base URL."""
        return str(self._api.configuration.host)

    async def get(self, resource: Resource, *, namespace: str | None = None, name: str) -> K8sObject:
        """Read one object; `NotFound` if it is not there."""
        return await self._json("GET", resource.path(namespace=namespace, name=name))

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """List objects (in one namespace, or in all when a namespaced resource gets no namespace)."""
        query = _query(labelSelector=label_selector, fieldSelector=field_selector)
        answer = await self._json("GET", resource.path(namespace=namespace), query=query)
        return ObjectList(
            items=list(answer.get("items") or []),
            resource_version=str(answer.get("metadata", {}).get("resourceVersion", "")),
        )

    async def list_pages(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int,
    ) -> AsyncIterator[ObjectList]:
        """List objects `limit` at a time (`limit` and `continue`): one consistent snapshot, never all in memory.

        Every page carries the list's resourceVersion. `Gone` when the snapshot expired between two
        pages (the API server keeps it a few minutes): list again.
        """
        token: str | None = None
        while True:
            query = _query(labelSelector=label_selector, fieldSelector=field_selector, limit=str(limit),
                           **{"continue": token})  # fmt: skip
            answer = await self._json("GET", resource.path(namespace=namespace), query=query)
            metadata = answer.get("metadata") or {}
            version = str(metadata.get("resourceVersion", ""))
            yield ObjectList(items=list(answer.get("items") or []), resource_version=version)
            token = metadata.get("continue") or None
            if token is None:
                return

    async def create(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        body: K8sObject,
        name: str | None = None,
        subresource: str | None = None,
    ) -> K8sObject:
        """Create an object; the namespace defaults to the body's `metadata.namespace`.

        `Conflict` (reason `AlreadyExists`) when the name is taken, `Invalid` when the body is rejected.
        With `name` and `subresource`, post to an object's subresource (a pod's `binding`, say).
        """
        if resource.namespaced and namespace is None:
            namespace = body.get("metadata", {}).get("namespace")
            if not namespace:
                raise ValueError(f"{resource.kind} is namespaced: pass namespace= or set metadata.namespace")
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._json("POST", path, body=body)

    async def patch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        name: str,
        body: K8sObject | JsonPatch,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> K8sObject:
        """Patch an object: `merge` is an RFC 7386 merge patch (a dict), `json` an RFC 6902 list of ops.

        Put `metadata.resourceVersion` in a merge patch (or a `test` op in a JSON patch) to make the
        write conditional: a stale one answers `Conflict` (or `Invalid`).
        """
        if patch_type not in _PATCH_CONTENT_TYPES:
            raise ValueError(f"patch_type must be one of {sorted(_PATCH_CONTENT_TYPES)}, not {patch_type!r}")
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._json("PATCH", path, body=body, content_type=_PATCH_CONTENT_TYPES[patch_type])

    async def replace(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        name: str,
        body: K8sObject,
        subresource: str | None = None,
    ) -> K8sObject:
        """Replace an object (PUT); the body must carry the `metadata.resourceVersion` it was read at."""
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        return await self._json("PUT", path, body=body)

    async def delete(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        name: str,
        propagation_policy: Literal["Background", "Foreground", "Orphan"] = "Background",
        grace_period_seconds: int | None = None,
        preconditions_uid: str | None = None,
        preconditions_resource_version: str | None = None,
    ) -> K8sObject:
        """Delete an object; returns the object (still there if it has finalizers) or a `Status`.

        With a precondition, `Conflict` if the object is no longer the one (uid) or the state
        (resourceVersion) the caller saw.
        """
        options: K8sObject = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation_policy}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {"uid": preconditions_uid, "resourceVersion": preconditions_resource_version}
        if any(preconditions.values()):
            options["preconditions"] = {key: value for key, value in preconditions.items() if value}
        return await self._json("DELETE", resource.path(namespace=namespace, name=name), body=options)

    async def watch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Stream changes until the server ends the stream; raises `Gone` when `resource_version` is too old.

        Pass the `resource_version` of a `list()` to see every change after it. The stream ends
        (normally) at `timeout_seconds` or whenever the server decides: callers loop and resume
        from the last seen resourceVersion.
        """
        query = _query(
            watch="true",
            labelSelector=label_selector,
            fieldSelector=field_selector,
            resourceVersion=resource_version,
            timeoutSeconds=str(timeout_seconds) if timeout_seconds is not None else None,
        )
        read_timeout = None if timeout_seconds is None else timeout_seconds + self._request_timeout
        response = await self._send(
            "GET", resource.path(namespace=namespace), query=query,
            client_timeout=aiohttp.ClientTimeout(sock_connect=_CONNECT_TIMEOUT_SECONDS, sock_read=read_timeout),
        )  # fmt: skip
        try:
            if response.status >= 400:
                raise error_from_text(status=response.status, text=await response.text())
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event["object"].get("code") or 500
                    raise error_from_status(status=int(status), body=event["object"])
                yield WatchEvent(type=event["type"], object=event["object"])
        finally:
            response.release()

    async def read_log(
        self, *, namespace: str, name: str, container: str | None = None, limit_bytes: int | None = None
    ) -> str:
        """Read a pod's log as text (the kubelet's answer, relayed by the API server).

        `limit_bytes` bounds what the server sends (from the start of the log): a container that
        wrote gigabytes cannot make the caller hold them.
        """
        path = PODS.path(namespace=namespace, name=name, subresource="log")
        query = _query(container=container, limitBytes=None if limit_bytes is None else str(limit_bytes))
        return await self._text("GET", path, query=query)

    @contextlib.asynccontextmanager
    async def attach(self, *, namespace: str, name: str, container: str) -> AsyncIterator[AttachSession]:
        """Attach to a running container's stdin, stdout and stderr (`pods/attach`, over a WebSocket).

        Needs `get` and `create` on `pods/attach` (the upgrade is a GET, and since Kubernetes 1.35 the
        API server also checks `create`). An upgrade the server refuses raises the matching `ApiError`
        (`NotFound` when the pod is gone); no connection within the request timeout, `Unavailable`.
        """
        query = _query(container=container, stdin="true", stdout="true", stderr="true")
        headers: dict[str, str] = {}
        await self._api.update_params_for_auth(headers, query, ["BearerToken"])
        url = f"{self.host}{PODS.path(namespace=namespace, name=name, subresource='attach')}?{urlencode(query)}"
        session: aiohttp.ClientSession = self._api.rest_client.pool_manager  # kubernetes_asyncio's, with its TLS
        try:
            async with asyncio.timeout(self._request_timeout):
                websocket = await session.ws_connect(url, headers=headers, protocols=(PROTOCOL, PROTOCOL_V4))
        except aiohttp.WSServerHandshakeError as exc:
            raise error_from_status(status=exc.status, text=f"attach to {name}: {exc.message}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(status=503, reason="ServiceUnavailable",
                              message=f"attach to {name}: {type(exc).__name__}: {exc}") from exc
        try:
            if websocket.protocol not in (PROTOCOL, PROTOCOL_V4):
                raise ApiError(status=400, reason="BadRequest",
                               message=f"attach to {name}: the server speaks neither {PROTOCOL} nor {PROTOCOL_V4}")
            yield AttachSession(websocket)
        finally:
            await websocket.close()

    async def _json(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> K8sObject:
        text = await self._text(method, path, query=query, body=body, content_type=content_type)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ApiError(status=200, reason="BadResponse", message=f"not JSON: {text[:200]!r}") from exc

    async def _text(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> str:
        """The answer's body; an error status becomes the matching `ApiError`, no answer in time `Unavailable`."""
        timeout = aiohttp.ClientTimeout(total=self._request_timeout, sock_connect=_CONNECT_TIMEOUT_SECONDS)
        try:
            async with self._turns:  # waiting for a turn is not the server's time: the deadline starts after
                response = await self._send(method, path, query=query, body=body, content_type=content_type,
                                            client_timeout=timeout)
                try:
                    text = await response.text()
                finally:
                    response.release()
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors (some also ClientErrors)
            raise Unavailable(status=504, reason="Timeout",
                              message=f"{method} {path}: no answer within {self._request_timeout:g} s") from exc
        except aiohttp.ClientError as exc:
            raise Unavailable(status=503, reason="ServiceUnavailable",
                              message=f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status >= 400:
            raise error_from_text(status=response.status, text=text)
        return text

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        # kubernetes_asyncio's auth settings give the bearer token (refreshed when needed); its session holds the
        # TLS settings, its rest client the proxy and SNI. Its call_api is skipped: that walks every body to
        # "sanitize" it (a copy of a plain dict) before encoding it, the dearest part of a request here.
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        query = list(query or [])
        await self._api.update_params_for_auth(headers, query, ["BearerToken"])
        url = f"{self._api.configuration.host}{path}"
        if query:
            url += "?" + urlencode(query)
        rest = self._api.rest_client
        extra: dict[str, Any] = {}
        if rest.proxy:
            extra.update(proxy=rest.proxy, proxy_headers=rest.proxy_headers)
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        session: aiohttp.ClientSession = rest.pool_manager
        return await session.request(method, url, headers=headers, data=data, timeout=client_timeout, **extra)


def _settle_proxy(api_client: k8s_client.ApiClient) -> None:
    """Look up the proxy for the API server in the environment once, not in a thread on every request.

    kubernetes_asyncio's session trusts the environment, so aiohttp read `~/.netrc` and the proxy
    variables in a worker thread for each request: two thread hops, a third of a millisecond of CPU
    each. The environment does not change under a running process; the API server's URL does not
    either. (Its own token is sent as a header: netrc credentials never applied to it.)
    """
    rest = api_client.rest_client
    session = rest.pool_manager
    if not session.trust_env:
        return
    if not rest.proxy:
        with contextlib.suppress(LookupError):
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(api_client.configuration.host))
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {**(rest.proxy_headers or {}), "Proxy-Authorization": auth.encode()}
    session._trust_env = False  # no public setter; the session is ours alone


def _any_file(paths: str) -> bool:
    """Whether a `$KUBECONFIG`-style list of paths names at least one file."""
    return any(os.path.isfile(os.path.expanduser(path)) for path in paths.split(os.pathsep) if path)


def _timeout_from_environment() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    if not text:
        return DEFAULT_REQUEST_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise KubeConfigError(f"{TIMEOUT_VARIABLE}={text!r} is not a positive number of seconds: set it to "
                              f"e.g. 30, or unset it for the default ({DEFAULT_REQUEST_TIMEOUT_SECONDS:g})")
    return seconds


def _query(**params: str | None) -> Query:
    return [(key, value) for key, value in params.items() if value is not None]
