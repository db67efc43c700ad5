"""Security contexts that satisfy Pod Security `restricted`, for every pod rockbot creates."""

from __future__ import annotations

from typing import Any


def restricted_container_context() -> dict[str, Any]:
    """A container that cannot escalate, write its root filesystem, run as root, or keep capabilities."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_pod_context(*, uid: int, fs_group: bool = False) -> dict[str, Any]:
    """A pod running as `uid` (and its group) under the runtime's default seccomp profile."""
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if fs_group:
        context["fsGroup"] = uid
    return context
