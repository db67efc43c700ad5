"""The webhook endpoint: `POST /hooks/<namespace>/<name>`, checked in the order that costs a sender least.

| answer | when                                                                                  |
| ------ | ------------------------------------------------------------------------------------- |
| 202    | the run is recorded and sent: `{"runId": ...}`                                        |
| 200    | recorded but not run (`Missed` under concurrencyPolicy Forbid), or `when` is false    |
| 400    | the body is not the JSON its Content-Type says, or the delivery id is too long        |
| 401    | the signature is missing or wrong (checked before anything about the Trigger is told) |
| 404    | no webhook Trigger of that name                                                       |
| 409    | the delivery id was seen before: `{"runId": ...}` of its run                          |
| 413    | the body is over `maxBodyBytes` (refused from Content-Length, or while reading)       |
| 415    | the Content-Type is not one of `contentTypes`                                         |
| 422    | the prompt did not render: the run is recorded Failed with the reason                 |
| 429    | over `maxRunsPerMinute`: nothing recorded, `Retry-After` says when to send it again    |
| 503    | the gateway cannot take it now (suspended, Agent not Ready, key unreadable, API down) |
Nothing a sender puts in a request makes a 5xx: 503 says "not now", with nothing recorded, so a retry
is safe. (One 503 carries a `runId`: the run was recorded but the agent's inbox refused it, so it is
recorded Failed.) Every answer is JSON with a `message` that says what to change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from rockbot.gateway.admission import Decision, Offer
from rockbot.gateway.catalog import Catalog
from rockbot.gateway.intake import Intake
from rockbot.gateway.secrets import Keys, Unreadable
from rockbot.gateway.signatures import verify
from rockbot.kube import ApiError, NotFound
from rockbot.resources.trigger import MAX_DELIVERY_ID
from rockbot.telemetry import server_spans

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
#: How much of a body's SHA-256 (hex) a delivery's record keeps: enough to tell a resent body from another.
DIGEST_CHARS = 16
#: How long requests being answered may take once the gateway stops.
STOP_SECONDS = 5.0
_CODES = {"started": 202, "missed": 200, "ignored": 200, "seen": 409, "failed": 422, "rate_limited": 429,
          "unavailable": 503, "undelivered": 503}  # fmt: skip
#: Told the status code of every answer (metrics).
Answered = Callable[[int], None]


def _answer(status: int, message: str, **fields: Any) -> web.Response:
    return web.json_response({"message": message, **fields}, status=status)


class Webhooks:
    def __init__(self, *, catalog: Catalog, keys: Keys, intake: Intake, on_answer: Answered | None = None) -> None:
        self._catalog = catalog
        self._keys = keys
        self._intake = intake
        self._on_answer = on_answer

    def app(self) -> web.Application:
        app = web.Application(middlewares=[server_spans(prefix="/hooks/")])
        app.router.add_route("*", "/hooks/{namespace}/{name}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            response = await self._respond(request)
        except NotFound:
            response = _answer(404, "the Trigger was deleted")
        except ApiError as exc:
            log.warning("webhook %s: the Kubernetes API failed: %s", request.path, exc)
            response = _answer(503, "the gateway cannot record deliveries right now; nothing was recorded: send it "
                               "again later")  # fmt: skip
        if self._on_answer is not None:
            self._on_answer(response.status)
        return response

    async def _respond(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if request.method != "POST":
            return web.json_response({"message": "send webhooks with POST"}, status=405, headers={"Allow": "POST"})
        entry = self._catalog.entries.get((namespace, name))
        if entry is None or entry.trigger.spec.webhook is None:
            return _answer(404, f"no webhook Trigger {namespace}/{name}")
        source = entry.trigger.spec.webhook
        limit = source.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return _answer(413, f"the body has {request.content_length} bytes; this Trigger takes at most {limit}")
        media = request.content_type if "Content-Type" in request.headers else None
        if media not in source.content_types:
            return _answer(415, f"Content-Type {media or 'missing'}: send one of {', '.join(source.content_types)}")
        body = await _read(request, limit=limit)
        if body is None:
            return _answer(413, f"the body is longer than this Trigger's limit of {limit} bytes")
        try:
            key = await self._keys.key(namespace=namespace, ref=source.secret_key_ref)
        except Unreadable as exc:  # said in the Trigger's Ready condition, not to whoever calls
            log.warning("webhook %s/%s cannot verify signatures: %s", namespace, name, exc)
            return _answer(503, "this Trigger cannot verify signatures right now (see its Ready condition); "
                           "nothing was recorded")  # fmt: skip
        signature = source.signature
        if not verify(key=key, body=body, header_value=request.headers.get(signature.header), signature=signature):
            return _answer(401, f"missing or wrong signature in {signature.header}: send {signature.prefix}"
                           f"<HMAC-SHA256 of the raw body, {signature.encoding}> made with the Trigger's key")
        digest = hashlib.sha256(body).hexdigest()
        delivery = request.headers.get(source.delivery_id_header) or f"sha256:{digest}"
        if len(delivery) > MAX_DELIVERY_ID:
            return _answer(400, f"{source.delivery_id_header} is longer than {MAX_DELIVERY_ID} characters")
        if entry.problem is not None:
            return _answer(503, f"this Trigger is not Ready: {entry.problem[1]}")
        payload = None
        if media == "application/json" or (media or "").endswith("+json"):
            try:
                payload = json.loads(body)
            except ValueError as exc:
                return _answer(400, f"the body is not JSON ({exc}), though its Content-Type says {media}")
        context = {
            "payload": payload,
            "body": body.decode("utf-8", errors="replace"),
            "headers": {header.lower(): value for header, value in request.headers.items()},
            "delivery": delivery,
            "trigger": {"namespace": namespace, "name": name},
        }
        offer = Offer(delivery_id=delivery, digest=digest[:DIGEST_CHARS])
        decision = await self._intake.take(entry, offer, context)
        return _answer_for(decision)


def _answer_for(decision: Decision) -> web.Response:
    fields: dict[str, Any] = {"runId": decision.run_id} if decision.run_id else {}
    messages = {
        "started": f"run {decision.run_id} started",
        "seen": f"this delivery was taken before, as run {decision.run_id}; it is not run again",
        "missed": decision.message,
        "ignored": decision.message,
    }
    message = messages.get(decision.outcome) or decision.message
    if decision.outcome in ("missed", "failed"):
        fields["outcome"] = "Missed" if decision.outcome == "missed" else "Failed"
    response = _answer(_CODES[decision.outcome], message, **fields)
    if decision.outcome == "rate_limited":
        response.headers["Retry-After"] = str(decision.retry_after)
    return response


async def _read(request: web.Request, *, limit: int) -> bytes | None:
    """The body, or None as soon as it passes `limit` (nothing more is read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class WebhookServer:
    """Serves `Webhooks` on one port, with TLS when given a context; `port` is the one bound."""

    def __init__(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_SECONDS)
        self.port: int | None = None

    async def start(self, *, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=host, port=port, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Stop taking requests; the ones being answered get `STOP_SECONDS`."""
        await self._runner.cleanup()


def tls_context(*, cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    return context
