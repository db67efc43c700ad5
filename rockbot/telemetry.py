"""Traces for every process (OpenTelemetry), off unless an OTLP endpoint is configured.

`setup_tracing(service=...)` installs the SDK with the OTLP/HTTP exporter when the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, unless
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`; everything else (headers, timeout,
sampler, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) is the SDK's own reading of the standard
variables. Without it the API's no-op tracer stays: a span is a few function calls and records
nothing, so code starts spans unconditionally and computes costly attributes only when
`span.is_recording()`.

Trace context crosses processes as W3C `traceparent`/`tracestate` (`inject`, `extract`): in HTTP
headers (`server_spans`, for aiohttp servers) and in the bus's AMQP message headers, so a request,
the sub-agent it calls and the script it runs share one trace.

What a person typed, what the model answered and tool arguments and results stay out of spans
unless `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` (the variable OpenTelemetry's GenAI
instrumentations use) says otherwise (`capture_content()`); secrets never go in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

log = logging.getLogger(__name__)

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: How long a stopping process waits for its last spans to reach the collector.
FLUSH_SECONDS = 3.0

#: The one tracer of rockbot's code; a proxy, so it follows a provider installed after import.
tracer = trace.get_tracer("rockbot")

_installed: object | None = None  # the SDK provider `setup_tracing` installed, if any
#: The W3C headers that carry a trace context.
TRACE_HEADERS = ("traceparent", "tracestate")


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def tracing_configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard variables ask for traces to be exported over OTLP."""
    env = os.environ if env is None else env
    if _true(env.get("OTEL_SDK_DISABLED")) or (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower() == "none":
        return False
    return any((env.get(name) or "").strip() for name in ENDPOINT_ENVS)


def capture_content(env: Mapping[str, str] | None = None) -> bool:
    """Whether prompts, answers and tool arguments and results may go into spans (an explicit opt-in)."""
    return _true((os.environ if env is None else env).get(CAPTURE_CONTENT_ENV))


def setup_tracing(*, service: str) -> bool:
    """Export this process's spans over OTLP/HTTP when configured (once per process); True when it does.

    `service` is the default `service.name`; `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` win.
    """
    global _installed
    if _installed is not None:
        return True
    if not tracing_configured():
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # a bounded flush at stop instead
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _installed = provider
    log.info("exporting traces over OTLP as service %s", resource.attributes.get(SERVICE_NAME))
    return True


def flush_tracing(timeout_seconds: float = FLUSH_SECONDS) -> None:
    """Send the spans still buffered, waiting at most `timeout_seconds` (blocking: call it in a thread)."""
    if _installed is not None:
        _installed.force_flush(timeout_millis=int(timeout_seconds * 1000))  # type: ignore[attr-defined]


def inject(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """The current trace context as W3C headers (empty when no span is recording)."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier)
    return carrier


def extract(headers: Mapping[str, object] | None) -> Context:
    """The trace context a message or request carried (W3C headers); an empty context without one."""
    carrier = {key.lower(): _text(value) for key, value in (headers or {}).items() if key.lower() in TRACE_HEADERS}
    return propagate.extract(carrier)


def _text(value: object) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def server_spans(*, prefix: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """aiohttp middleware: a server span for each request under `prefix` (not probes or metrics), continuing
    the caller's trace when it sent `traceparent`; named by the route, never by the path (which holds ids)."""

    @web.middleware
    async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(prefix):
            return await handler(request)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else ""  # no route: named by the method alone
        with tracer.start_as_current_span(
            f"{request.method} {route}".strip(), context=extract(request.headers), kind=SpanKind.SERVER
        ) as span:  # fmt: skip
            span.set_attributes({"http.request.method": request.method, "http.route": route,
                                 "url.path": request.path})  # fmt: skip
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                span.set_attribute("http.response.status_code", exc.status)
                raise
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response

    return traced
