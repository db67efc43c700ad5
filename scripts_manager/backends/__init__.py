"""Where scripts run: one interface, two sandboxes (`pods` in a cluster, `local` for development).

A backend turns a checked `ScriptJob` into a `ScriptInvokeResponse` and always cleans up after
itself; it raises `SandboxUnavailable` when it cannot run anything right now (retryable) and
`SandboxFailure` when this one run broke for reasons other than the script's own.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from rockbot.contracts.scripts import ScriptInvokeResponse


class ScriptJob(BaseModel):
    """A request that passed the manager's checks, ready for a sandbox."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    script: str
    input_data: str | None
    timeout_seconds: float
    packages: tuple[str, ...] = ()
    # The sandbox's CPU and memory (pod requests = limits), checked against the manager's maximums;
    # None: the manager's defaults (ROCKBOT_SCRIPTS_CPU, ROCKBOT_SCRIPTS_MEMORY).
    cpu: str | None = None
    memory: str | None = None


class SandboxUnavailable(Exception):
    """The sandbox cannot run scripts at the moment (cluster unreachable, isolation missing)."""


class SandboxFailure(Exception):
    """This run failed for a reason that is not the script's (pod rejected, output unreadable)."""


class ScriptBackend(Protocol):
    name: str

    async def start(self) -> None:
        """Begin background work (the pod backend's sweeper)."""

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse: ...

    async def close(self) -> None: ...
