"""The audit log reader that the operator's request-counting tests and benchmark rely on, across a rotation."""

from __future__ import annotations

import json
from pathlib import Path

from tests.operator.audit import AuditLog


def _line(name: str, *, namespace: str = "ns-1") -> str:
    return json.dumps({
        "stage": "ResponseComplete", "verb": "create", "user": {"username": "system:serviceaccount:x:operator"},
        "objectRef": {"resource": "configmaps", "namespace": namespace, "name": name},
        "requestReceivedTimestamp": "2026-11-27T10:00:00.000000Z",
    }) + "\n"  # fmt: skip


def test_the_lines_written_just_before_a_rotation_are_read_from_the_renamed_file(tmp_path: Path):
    log = tmp_path / "audit.log"
    log.write_text(_line("before-the-reader"))
    reader = AuditLog(log, namespace="ns-1")
    with log.open("a") as out:
        out.write(_line("last-of-the-old-file") + _line("elsewhere", namespace="ns-2"))
    log.rename(tmp_path / "audit-2026-11-27T11-18-11.214.log")  # as the API server rotates at its size limit
    log.write_text(_line("first-of-the-new-file"))

    assert [event.name for event in reader.read()] == ["last-of-the-old-file", "first-of-the-new-file"]
    with log.open("a") as out:
        out.write(_line("later"))
    assert [event.name for event in reader.read()][-1:] == ["later"]
