"""When a process exports traces: only with an OTLP endpoint, and never when the standard switches say no."""

from __future__ import annotations

from rockbot.telemetry import capture_content, tracing_configured

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


def test_traces_are_exported_only_to_a_configured_otlp_endpoint():
    assert not tracing_configured({})
    assert not tracing_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    assert tracing_configured(ENDPOINT)
    assert tracing_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})


def test_the_standard_switches_turn_tracing_off_even_with_an_endpoint():
    assert not tracing_configured({**ENDPOINT, "OTEL_SDK_DISABLED": "true"})
    assert not tracing_configured({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"})
    assert tracing_configured({**ENDPOINT, "OTEL_SDK_DISABLED": "false"})


def test_content_goes_into_spans_only_when_explicitly_opted_in():
    assert not capture_content({})
    assert not capture_content({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "yes"})
    assert capture_content({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "True"})
