"""Where scripts run: one interface, two sandboxes (`pods` in a cluster, `local` for development).

A backend turns a checked `ScriptJob` into a `ScriptInvokeResponse` and always cleans up after
itself; it raises `SandboxUnavailable` when it cannot run anything right now (retryable),
`SandboxFailure` when this one run broke for reasons other than the script's own, and `CredentialsRevoked`
when the cluster no longer accepts this process at all (the service then stops: see service.py).
"""

from __future__ import annotations

import asyncio
import enum
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from rockbot.contracts.scripts import FileName, ScriptInvokeResponse
from rockbot.scripts_manager.backends.outputs import OutputBounds


class Asker(BaseModel):
    """Who waits for a job's answer, and where it goes: the pod backend records it on the job's pod, so that
    whichever manager outlives this one can answer the job if this one dies (backends/reaping.py)."""

    model_config = ConfigDict(frozen=True)

    user: str  # the sender's broker user, as the broker validated it
    reply_to: str  # one of that agent's own reply queues (the manager checked it)
    correlation_id: str


class InputFile(BaseModel):
    """One of the conversation's files, as a script sees it under `/input` (the name is checked, never a host path)."""

    model_config = ConfigDict(frozen=True)

    name: FileName
    content: bytes


class SessionTerms(BaseModel):
    """A call of an Agent with `scriptSessions: PerConversation`: whose session it uses and how long one lives."""

    model_config = ConfigDict(frozen=True)

    owner: str  # the sender's broker user, as the broker validated it: sessions are never shared between agents
    session: str  # the request's digest of the conversation (agent, validated caller, session id)
    idle_seconds: int
    max_seconds: int

    @property
    def key(self) -> str:
        return f"{self.owner}/{self.session}"


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
    # The conversation's files, seen read-only under /input, and the bounds of what comes back from /output.
    files: tuple[InputFile, ...] = ()
    output_bounds: OutputBounds = OutputBounds()
    # Who asked; None for the manager's own jobs (the isolation canary).
    asker: Asker | None = None
    # The conversation's session, for an Agent that keeps one (None: a sandbox of its own, ended after it).
    session: SessionTerms | None = None


class SandboxUnavailable(Exception):
    """The sandbox cannot run scripts at the moment (cluster unreachable, isolation missing)."""


class SandboxFailure(Exception):
    """This run failed for a reason that is not the script's (pod rejected, output unreadable)."""


class CredentialsRevoked(Exception):
    """The Kubernetes API refused this process's credentials (401): its pod or ServiceAccount was deleted, so its
    bound token was revoked, while the process lives on until the kubelet stops it. Not the job's failure: no job
    can run here any more. `may_have_run`: a sandbox was made for the job before the refusal (its script may have
    started, and another manager would take a copy for running), so it must be answered, not handed on."""

    def __init__(self, message: str, *, may_have_run: bool) -> None:
        super().__init__(message)
        self.may_have_run = may_have_run


class Orphan(BaseModel):
    """A job whose manager instance died (its pod reaped by another, see reaping.py): who waits for its answer."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    asker: Asker
    pod: str
    manager: str  # the dead instance's id


class Taken(enum.Enum):
    """What became of a request before the copy of it now at hand (that copy must not run the script again)."""

    RUNNING = "a sandbox runs it (or ran it), and its manager, or whoever cleans up after that one, answers it"
    REAPED = "its sandbox was deleted because the manager running it died, and its asker was answered"


class ScriptBackend(Protocol):
    name: str
    #: Jobs of dead manager instances whose sandboxes this backend reaped, for the service to answer (None: its
    #: sandboxes die with their manager, so it has none).
    orphans: asyncio.Queue[Orphan] | None
    #: The most a job it takes may wait for its script to start (sandbox start-up, packages) and its answer
    #: after its timeout: with the timeout, what the manager tells the asker it answers within.
    start_seconds: float

    async def start(self) -> None:
        """Begin background work (the pod backend's Lease, reaper and pool)."""

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse: ...

    async def taken_before(self, *, user: str, request_id: str) -> Taken | None:
        """What became of this request before (asked for a copy the broker redelivered); None when no sandbox took
        it, so its script has not started anywhere."""

    async def close(self) -> None: ...
