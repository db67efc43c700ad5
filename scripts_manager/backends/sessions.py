"""The bookkeeping of script sessions (`scriptSessions: PerConversation`) that every backend shares.

A backend keeps its sessions' sandboxes (a bubblewrap sandbox in local_sessions.py, a pod in pod_sessions.py);
this keeps which conversation has which, and when one ends: a session is keyed by the sender's broker-validated
user and the request's conversation digest (`SessionTerms.key`), so two agents, or two callers of one agent, never
share one; a conversation's calls run one after another; it ends when idle for its Agent's `idleSeconds` or alive
for its `maxSeconds` (the sweep, every second), when a call ended it (crash, out of memory or time), when the
Agent's limits or sessions settings change or a call asks for other packages (`shape`), past the manager's caps
(ROCKBOT_SCRIPTS_SESSIONS_PER_AGENT: the agent's least recently used idle session ends; ROCKBOT_SCRIPTS_SESSIONS:
a new one is refused, retryable), and when the manager stops. The next call of a conversation whose session ended
says `restarted`: never silently a fresh interpreter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Generic, TypeVar

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.backends import SandboxUnavailable, ScriptJob, SessionTerms
from rockbot.scripts_manager.backends.pod_manifests import SANDBOX_FILES
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: The persistent interpreter every backend's session runs (kernel.py, standard library only), after the code a
#: pod's runner has to move files (a pod's kernel moves its calls' files; the local backend's moves none).
KERNEL = SANDBOX_FILES + "\n" + (Path(__file__).parent / "kernel.py").read_text()
_SWEEP_SECONDS = 1.0
#: The most a kernel's line after a call's marker holds without files (its exit code).
TRAILER_BYTES = 4096
#: Conversations whose session ended, remembered so their next call says `restarted`.
_REMEMBERED_ENDS = 4096


class KernelStream:
    """One of a session's output streams (kernel.py's stdout or stderr): a call's output is what comes before that
    call's marker."""

    def __init__(self) -> None:
        self._marker = b""
        self._cap = 0
        self._kept = bytearray()
        self._pending = bytearray()  # bytes that may be the start of the marker
        self._trailer: bytearray | None = None
        self._wants_trailer = False
        self._trailer_cap = 0
        self.truncated = self.overflowed = False
        self.ended = asyncio.Event()
        self.closed = asyncio.Event()

    def begin(self, *, marker: bytes, cap: int, trailer: int = 0) -> None:
        """A call's output starts: kept up to `cap` bytes until `marker`, then (with `trailer`, its bound in bytes)
        the kernel's JSON line after it."""
        self._marker, self._cap, self._wants_trailer = marker, cap, trailer > 0
        self._trailer_cap = trailer
        self._kept, self._pending, self._trailer = bytearray(), bytearray(), None
        self.truncated = self.overflowed = False
        self.ended = asyncio.Event()

    def feed(self, chunk: bytes) -> None:
        if not self._marker or self.ended.is_set():
            return  # between calls: something a script left running writes to nobody
        if self._trailer is not None:
            self._trailer += chunk
            if len(self._trailer) > self._trailer_cap:  # more than the kernel ever writes: not the kernel's
                self.overflowed = True
                self._trailer.clear()
                self.ended.set()
            elif b"\n" in chunk:
                self.ended.set()
            return
        self._pending += chunk
        found = self._pending.find(self._marker)
        if found < 0:
            keep = len(self._pending) - len(self._marker) + 1
            if keep > 0:
                self._keep(self._pending[:keep])
                del self._pending[:keep]
            return
        self._keep(self._pending[:found])
        rest = bytes(self._pending[found + len(self._marker):])
        self._pending.clear()
        if self._wants_trailer:
            self._trailer = bytearray()
            self.feed(rest)
        else:
            self.ended.set()

    def _keep(self, data: bytes | bytearray) -> None:
        room = self._cap - len(self._kept)
        self._kept += data[: max(room, 0)]
        self.truncated = self.truncated or len(data) > room

    def text(self) -> str:
        if not self.ended.is_set():  # the session died mid-call: what it wrote, marker or not
            self._keep(self._pending)
            self._pending.clear()
        return self._kept.decode(errors="replace")

    def trailer(self) -> dict[str, object]:
        """The kernel's JSON line after the call's marker (its exit code, a pod's files); empty if unreadable (the
        script wrote over it)."""
        try:
            fields = json.loads(bytes(self._trailer or b"").partition(b"\n")[0])
        except ValueError:
            return {}
        return fields if isinstance(fields, dict) else {}

    def exit_code(self) -> int | None:
        """The call's exit code from the kernel's trailer; None if that is unreadable."""
        code = self.trailer().get("exit_code")
        return code if isinstance(code, int) and not isinstance(code, bool) else None


def call_line(job: ScriptJob, **files: object) -> tuple[bytes, bytes]:
    """A call for kernel.py (one JSON line) and the marker that ends its output, made for this call; `files` are a
    pod's (kernel.py: `input_files`, `input_removed`, `output_bounds`)."""
    marker = f"\0rockbot-end-{secrets.token_hex(16)}\0"
    line = json.dumps({"script": job.script, "input": job.input_data, "marker": marker, **files}).encode() + b"\n"
    return line, marker.encode()


def kernel_answer(job: ScriptJob, *, out: KernelStream, err: KernelStream, **fields: object) -> ScriptInvokeResponse:
    """A call's answer from what the kernel's two streams kept, and the backend's `fields` (exit code, timeout...)."""
    return ScriptInvokeResponse(request_id=job.request_id, stdout=out.text(), stderr=err.text(),
                                output_truncated=out.truncated or err.truncated, **fields)  # type: ignore[arg-type]


class Session:
    """What every backend's session has: its terms, its shape (a call of another shape needs a new sandbox), and
    when it started and was last used."""

    def __init__(self, *, terms: SessionTerms, shape: tuple[object, ...], max_seconds: float | None = None) -> None:
        self.terms = terms
        self.shape = shape
        #: How long it may live: the Agent's maxSeconds, or less when its sandbox cannot live that long.
        self.max_seconds = terms.max_seconds if max_seconds is None else min(max_seconds, terms.max_seconds)
        self.started = self.used = time.monotonic()
        self.answered = 0
        self.busy = False

    def due(self, now: float) -> bool:
        """Whether it has been idle or alive too long (the Agent's idleSeconds, maxSeconds)."""
        return (now - self.used >= self.terms.idle_seconds) or (now - self.started >= self.max_seconds)

    def gone(self) -> bool:
        """Whether its sandbox ended (a crash, a kill): it cannot take another call."""
        raise NotImplementedError

    def lasts(self, job: ScriptJob) -> bool:
        """Whether its sandbox lives long enough for this call (a pod's deadline)."""
        return True


S = TypeVar("S", bound=Session)


class Sessions(Generic[S]):
    """One backend's sessions: which conversation has which, and their ends. A backend says how a session's
    sandbox opens (`_open`), takes a call (`_call`), is stopped at once (`_stop`) and cleaned up (`_clean`)."""

    def __init__(self, *, settings: ScriptsManagerSettings) -> None:
        self._settings = settings
        self._live: dict[str, S] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._sweeping: asyncio.Task[None] | None = None
        self._cleaning: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Sessions alive now."""
        return len(self._live)

    async def run(self, job: ScriptJob) -> ScriptInvokeResponse:
        """Run `job` in its conversation's session (made, or made again, as needed)."""
        terms = job.session
        assert terms is not None
        lock = self._locks.setdefault(terms.key, asyncio.Lock())
        async with lock:
            shape = (job.packages, job.cpu, job.memory, terms.idle_seconds, terms.max_seconds)
            session = self._live.get(terms.key)
            if session is not None and (session.shape != shape or session.gone() or session.due(time.monotonic())
                                        or not session.lasts(job)):
                await self._end(session, why="its Agent's limits changed" if session.shape != shape else "it ended")
                session = None
            if session is None:
                self._make_room(terms)
                session, replaced = await self._open(job, shape=shape)
                said = "restarted" if terms.key in self._ended or replaced else "new"
                self._ended.pop(terms.key, None)
                self._live[terms.key] = session
                if self._sweeping is None or self._sweeping.done():
                    self._sweeping = asyncio.create_task(self._sweep(), name="end idle script sessions")
            else:
                said = "kept"
            session.busy = True
            try:
                reply = await self._call(session, job)
            finally:
                session.busy = False
                session.used = time.monotonic()
                session.answered += 1
            if session.gone():
                await self._end(session, why="its script ended it")
                said = "ended"
            return reply.model_copy(update={"session": said})

    async def close(self) -> None:
        await cancel_and_wait(self._sweeping)
        for session in list(self._live.values()):
            await self._end(session, why="the scripts-manager stops")
        await asyncio.gather(*self._cleaning, return_exceptions=True)

    async def _open(self, job: ScriptJob, *, shape: tuple[object, ...]) -> tuple[S, bool]:
        """A new session's sandbox, and whether it replaced one of this conversation that another manager held."""
        raise NotImplementedError

    async def _call(self, session: S, job: ScriptJob) -> ScriptInvokeResponse:
        raise NotImplementedError

    def _stop(self, session: S) -> None:
        """End the session's sandbox at once (without waiting)."""
        raise NotImplementedError

    async def _clean(self, session: S) -> None:
        """Once stopped: wait for its end and free what it held."""
        raise NotImplementedError

    def _make_room(self, terms: SessionTerms) -> None:
        """Refuse, or end the agent's least recently used idle session, so the new one stays within the caps."""
        own = [session for session in self._live.values() if session.terms.owner == terms.owner]
        if len(own) >= self._settings.scripts_sessions_per_agent:
            idle = [session for session in own if not session.busy]
            if not idle:
                raise SandboxUnavailable(
                    f"this agent has {len(own)} script sessions busy, its most at this scripts-manager "
                    "(ROCKBOT_SCRIPTS_SESSIONS_PER_AGENT): try again when one of its calls has ended"
                )
            oldest = min(idle, key=lambda session: session.used)
            self._forget(oldest, why="its agent opened more sessions than ROCKBOT_SCRIPTS_SESSIONS_PER_AGENT")
        if len(self._live) >= self._settings.scripts_sessions:
            raise SandboxUnavailable(
                f"the scripts-manager keeps {len(self._live)} script sessions, its most (ROCKBOT_SCRIPTS_SESSIONS): "
                "try again when one has ended (idle sessions end after their Agent's scriptSessions.idleSeconds)"
            )

    def _forget(self, session: S, *, why: str) -> None:
        """End a session that no call uses, without waiting for it (the sweep and the caps)."""
        self._live.pop(session.terms.key, None)
        self._remember_end(session.terms.key)
        self._stop(session)
        cleaning = asyncio.create_task(self._finish(session, why=why), name="remove an ended script session")
        self._cleaning.add(cleaning)
        cleaning.add_done_callback(self._cleaning.discard)

    async def _end(self, session: S, *, why: str) -> None:
        if self._live.get(session.terms.key) is session:
            del self._live[session.terms.key]
            self._remember_end(session.terms.key)
        self._stop(session)
        await self._finish(session, why=why)

    async def _finish(self, session: S, *, why: str) -> None:
        await self._clean(session)
        log.info("script session of %s ended after %d calls: %s", session.terms.owner, session.answered, why)

    def _remember_end(self, key: str) -> None:
        self._ended[key] = None
        while len(self._ended) > _REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    async def _sweep(self) -> None:
        while self._live:
            await asyncio.sleep(_SWEEP_SECONDS)
            now = time.monotonic()
            for session in list(self._live.values()):
                if not session.busy and session.due(now):
                    self._forget(session, why="idle or old (its Agent's scriptSessions)")
            await self._tend()

    async def _tend(self) -> None:
        """Each second, what a backend's live sessions need besides (the pods' keepalives)."""
