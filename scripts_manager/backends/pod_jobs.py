"""Hand one job to a running script pod and read its answer, over `pods/attach`.

The job goes to the runner's stdin as one JSON line with a fresh nonce, then the conversation's files as raw bytes
(the line names their names and sizes); the runner's stdout comes
back on the same session, and only its lines carrying that nonce count (see runner.py for why a
script can neither write there nor learn the nonce). The answer arrives as soon as the runner prints
it, never waiting for the kubelet to report the container's end. What is read is bounded: the
runner's two capped streams as JSON, at most six bytes per byte written, and the output's files as base64 within
the job's bounds.

The steps are events on the current span (`attached`, `job written`, `script started`, `answered`),
and the runner's own times (its process start, first instruction, the job read, the script handed
over and its end) follow as events stamped on the pod's clock: where a job's time goes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from opentelemetry import trace

from rockbot.kube import KubeClient
from rockbot.kube.attach import STDOUT, AttachSession
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.backends.figures import FIGURES_MODULE_SOURCE
from rockbot.scripts_manager.backends.outputs import OutputBounds
from rockbot.scripts_manager.backends.pod_manifests import CONTAINER
from rockbot.scripts_manager.runner import RESULT_KEY, STARTED_KEY

log = logging.getLogger(__name__)


#: The conversation's files go to the pod in pieces of this size (one WebSocket message each).
INPUT_CHUNK_BYTES = 256 * 1024


def output_limit(max_output_bytes: int, bounds: OutputBounds) -> int:
    """The most a runner prints for one job: both capped streams as JSON (six bytes a byte at worst), and the
    output's files as base64 with their names and the sentences of what was left out."""
    return 12 * max_output_bytes + 4 * bounds.total_bytes // 3 + 8 * 1024 * (bounds.files + 16) + 64 * 1024


class OutputTooLarge(Exception):
    """The pod wrote more than its runner ever does: something other than the runner wrote."""


@dataclass
class RunnerOutput:
    """The runner's stdout as it arrives; lines without this run's nonce are not the runner's answer."""

    nonce: str
    limit: int
    started: bool = False
    result: dict[str, Any] | None = None
    _pending: bytearray = field(default_factory=bytearray)
    _seen: int = 0

    def feed(self, data: bytes) -> None:
        self._seen += len(data)
        if self._seen > self.limit:
            raise OutputTooLarge(f"the pod wrote more than {self.limit} bytes, more than its runner ever does")
        if b"\n" not in data:  # a long line (the files' base64) grows here, never rescanned: linear in its size
            self._pending += data
            return
        *lines, rest = data.split(b"\n")
        self._pending += lines[0]
        first, self._pending = self._pending, bytearray(rest)
        self._line(first)
        del first  # the long line's memory goes before the next lines are read
        for line in lines[1:]:
            self._line(line)

    def finish(self) -> None:
        """The stream ended: its last line counts even without a newline."""
        rest, self._pending = bytes(self._pending), bytearray()
        self._line(rest)

    def _line(self, line: bytes | bytearray) -> None:
        try:
            said = json.loads(line)
        except ValueError:
            return
        if not isinstance(said, dict):
            return
        if said.get(STARTED_KEY) == self.nonce:
            self.started = True
        elif said.get(RESULT_KEY) == self.nonce and self.result is None:
            self.started = True
            self.result = said


@dataclass
class Attempt:
    """What one attach session brought: the runner's output so far, and how the session ended."""

    output: RunnerOutput
    status: dict[str, Any] | None = None


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def job_line(*, job: ScriptJob, nonce: str, max_output_bytes: int, kernel: str | None = None) -> bytes:
    """The runner's job; with `kernel` (kernel.py's source) the runner becomes a session's kernel (pod_sessions.py)."""
    return json.dumps({
        **({"kernel": kernel} if kernel is not None else {}),
        "nonce": nonce, "script": job.script, "input": job.input_data or "",
        "timeout_seconds": job.timeout_seconds, "max_output_bytes": max_output_bytes,
        "output_bounds": list(job.output_bounds), "figures_hook": FIGURES_MODULE_SOURCE,
        "input_files": [[file.name, len(file.content)] for file in job.files],
    }, ensure_ascii=False).encode() + b"\n"  # fmt: skip


async def write_files(session: AttachSession, job: ScriptJob) -> None:
    """The job's files, as raw bytes after its line in the sizes it names (runner.py: _receive_inputs)."""
    for file in job.files:
        for start in range(0, len(file.content), INPUT_CHUNK_BYTES):
            await session.write(file.content[start:start + INPUT_CHUNK_BYTES])


async def run_job(
    *,
    kube: KubeClient,
    namespace: str,
    name: str,
    job: ScriptJob,
    nonce: str,
    max_output_bytes: int,
    on_started: Callable[[], None],
    session: AttachSession | None = None,
) -> Attempt:
    """Attach (or use `session`, opened before), write the job, read until the runner's result (or the session's
    end, or a broken stream)."""
    attempt = Attempt(output=RunnerOutput(nonce=nonce, limit=output_limit(max_output_bytes, job.output_bounds)))
    span = trace.get_current_span()
    async with contextlib.AsyncExitStack() as stack:
        if session is None:
            session = await stack.enter_async_context(kube.attach(namespace=namespace, name=name, container=CONTAINER))
        span.add_event("attached")
        try:
            await session.write(job_line(job=job, nonce=nonce, max_output_bytes=max_output_bytes))
            await write_files(session, job)
            span.add_event("job written")
            async for piece in session:
                if piece.channel != STDOUT:  # the runner's own stderr: the answer is on stdout only
                    continue
                was_started = attempt.output.started
                attempt.output.feed(piece.data)
                if attempt.output.started and not was_started:
                    span.add_event("script started")
                    on_started()
                if attempt.output.result is not None:
                    span.add_event("answered")
                    _runner_events(span, attempt.output.result)
                    break
        except (aiohttp.ClientError, ConnectionError) as exc:  # the stream broke: the pod and its log tell the rest
            log.info("the attach session to %s broke (%r)", name, exc)
        attempt.status = session.status
    return attempt


#: The runner's `times` (see runner.py) as span events, in the order they happen.
RUNNER_EVENTS = {"process": "runner process started", "main": "runner running", "job": "runner read the job",
                 "handed": "script handed over", "exited": "script exited"}


def _runner_events(span: trace.Span, result: dict[str, Any]) -> None:
    if not span.is_recording() or not isinstance(times := result.get("times"), dict):
        return
    for key, event in RUNNER_EVENTS.items():
        if isinstance(stamp := times.get(key), int | float):
            span.add_event(event, timestamp=int(stamp * 1e9))
