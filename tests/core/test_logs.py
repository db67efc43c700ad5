"""JSON logs: one object per line, whatever a record carries."""

from __future__ import annotations

import dataclasses
import json
import logging
import queue

import kopf

from rockbot.logs import json_formatter


@dataclasses.dataclass
class _HoldsAQueue:
    pending: queue.SimpleQueue = dataclasses.field(default_factory=queue.SimpleQueue)


def _format(record: logging.LogRecord) -> dict:
    text = json_formatter().format(record)
    assert "\n" not in text
    return json.loads(text)


def test_a_kopf_per_object_record_is_one_json_line_naming_its_object():
    body = kopf.Body({"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent",
                      "metadata": {"name": "analyst", "namespace": "team", "uid": "u-1"}})
    adapter = kopf.ObjectLogger(body=body, settings=kopf.OperatorSettings())
    record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler %r succeeded.", ("x",), None)
    _, kwargs = adapter.process(record.msg, {})
    record.__dict__.update(kwargs["extra"])
    line = _format(record)
    assert line["message"] == "Handler 'x' succeeded." and line["level"] == "INFO"
    assert line["object"] == {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "name": "analyst",
                              "uid": "u-1", "namespace": "team"}
    assert "settings" not in line and "k8s_skip" not in line


def test_an_extra_json_cannot_encode_is_written_as_text_not_lost():
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "careful", (), None)
    record.thing = _HoldsAQueue()
    line = _format(record)
    assert line["message"] == "careful" and line["thing"] == "<_HoldsAQueue>"
