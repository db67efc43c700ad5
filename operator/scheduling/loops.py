"""One supervised loop per watched object (a ScheduledTask, an Evaluation), woken by its changes, its Agent's and
the clock.

A watch of the objects' resource in each namespace keeps every object's latest body; the first body starts the
object's loop, the later ones wake it. The loop runs its owner's step (plan from the latest body, write, act),
which says whether to step again at once, else when to wake at the latest. An error ends a step, never the loop:
it is logged (with a traceback when it is not a known API, HTTP or bus failure), `recovering` is set so that the
next step takes up what the failed one may have left half done, and the step is tried again after a growing
pause. Agents come from the operator's own watch of them (`AgentFeed`) or from one started here; the owner keeps
what it needs of them and wakes the objects whose `spec.agentRef` names a changed one (`wake_referrers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from rockbot.bus import BusError
from rockbot.clock import Clock
from rockbot.kube import AGENTS, ApiError, KubeClient, NotFound, Resource
from rockbot.kube.mirroring import mirror
from rockbot.tasks import cancel_and_wait

ERROR_BACKOFF_SECONDS = (0.5, 1, 2, 5, 10, 30)
#: Failures a step is expected to meet now and then; anything else is logged as a bug, with its traceback.
TRANSIENT_ERRORS = (ApiError, BusError, OSError, aiohttp.ClientError)
Key = tuple[str, str]
#: What a step returns: (step again at once, else when to wake at the latest: None for only when woken).
Next = tuple[bool, datetime.datetime | None]


class AgentFeed(Protocol):
    """Agents as another watch of them shows them (the operator's own): no second stream of every Agent event."""

    def follow_agents(
        self, on_upsert: Callable[[dict[str, Any]], None], on_delete: Callable[[str, str], None]
    ) -> Callable[[], None]:
        """Call these for every Agent known now and every change from now on, until the returned function is called."""
        ...


@dataclass
class LoopState:
    body: dict[str, Any]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    loop: asyncio.Task[None] | None = None
    #: Whether the next step takes up what an earlier one may have left half done (the loop is new or a step failed).
    recovering: bool = True
    #: Bodies the watch delivered: what a write returned is kept only if the watch delivered nothing since (else
    #: the watch's is as new, and overwriting it with the write's could lose a change made meanwhile).
    seen: int = 0

    def keep(self, written: dict[str, Any], *, seen: int) -> None:
        if self.seen == seen:
            self.body = written


Step = Callable[[Key, LoopState], Coroutine[Any, Any, Next]]


class ObjectLoops:
    """A loop running `step` for every `resource` object in `namespaces` (all when empty); `start()` then `stop()`.

    `kind` names the objects in the log (`logger`, the owner's). `shielded`: a step runs to its end even when its
    loop is cancelled (`stop()` waits for it), so that a write is followed by what it records. `wake_in_backoff`:
    a change ends the pause after a failure (else it lasts, on `clock`: a loop whose own writes echo back as changes
    would step again at once). `forget`: called once an object is deleted."""

    def __init__(self, *, kube: KubeClient, resource: Resource, kind: str, namespaces: list[str] | None,
                 clock: Clock, step: Step, logger: logging.Logger, agents: AgentFeed | None,
                 on_agent: Callable[[dict[str, Any]], None], on_agent_deleted: Callable[[str, str], None],
                 shielded: bool, wake_in_backoff: bool,
                 forget: Callable[[str, str], None] | None = None) -> None:  # fmt: skip
        self._kube = kube
        self._resource = resource
        self._kind = kind
        self._namespaces: list[str | None] = list(namespaces or []) or [None]
        self._clock = clock
        self._step = step
        self._log = logger
        self._feed = agents
        self._on_agent, self._on_agent_deleted = on_agent, on_agent_deleted
        self._shielded, self._wake_in_backoff = shielded, wake_in_backoff
        self._forget = forget
        self.states: dict[Key, LoopState] = {}
        self._unfollow: Callable[[], None] | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._steps: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        mirrored = [(self._resource, self.seen, self.deleted)]
        if self._feed is None:
            mirrored.append((AGENTS, self._on_agent, self._on_agent_deleted))
        else:
            self._unfollow = self._feed.follow_agents(self._on_agent, self._on_agent_deleted)
        for namespace in self._namespaces:
            for resource, on_upsert, on_delete in mirrored:
                watching = mirror(kube=self._kube, resource=resource, namespace=namespace, on_upsert=on_upsert,
                                  on_delete=on_delete)  # fmt: skip
                name = f"watch {resource.plural} in {namespace or 'all namespaces'} for the {self._kind} loops"
                self._watchers.append(asyncio.create_task(watching, name=name))

    async def stop(self) -> None:
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
        await cancel_and_wait(*self._watchers, *(state.loop for state in self.states.values() if state.loop))
        await asyncio.gather(*self._steps, return_exceptions=True)  # a shielded step ends what it wrote
        self._watchers.clear()
        self.states.clear()

    def seen(self, body: dict[str, Any]) -> None:
        """The object's latest body: kept, and its loop woken (started, when it has none running)."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = LoopState(body=body)
        else:
            state.body = body
            state.changed.set()
        state.seen += 1
        if state.loop is None or state.loop.done():
            state.loop = asyncio.create_task(self._loop(key, state), name=f"{self._kind} {key[0]}/{key[1]}")

    def deleted(self, namespace: str, name: str) -> None:
        state = self.states.pop((namespace, name), None)
        if state is not None and state.loop is not None:
            state.loop.cancel()
        if self._forget is not None:
            self._forget(namespace, name)

    def wake_referrers(self, agent: Key) -> None:
        """Wake the loops of the objects whose `spec.agentRef` names `agent`."""
        for (namespace, _), state in self.states.items():
            if namespace == agent[0] and agent_of(state.body) == agent[1]:
                state.changed.set()

    async def _loop(self, key: Key, state: LoopState) -> None:
        failures = 0
        state.recovering = True
        while True:
            state.changed.clear()
            try:
                step = self._step(key, state)
                again, until = await (self._shield(step) if self._shielded else step)
                failures = 0
            except NotFound:
                self._log.info("%s %s/%s is gone; its loop ends", self._kind, *key)
                return
            except Exception as exc:
                state.recovering = True
                delay = ERROR_BACKOFF_SECONDS[min(failures, len(ERROR_BACKOFF_SECONDS) - 1)]
                failures += 1
                if isinstance(exc, TRANSIENT_ERRORS):
                    self._log.warning("%s %s/%s: %r; trying again in %s s", self._kind, *key, exc, delay)
                else:
                    self._log.exception("%s %s/%s: the loop failed unexpectedly; trying again in %s s",
                                        self._kind, *key, delay)  # fmt: skip
                await self._pause(state, delay)
                continue
            if not again:
                await self._wait(state, until)

    async def _shield(self, step: Coroutine[Any, Any, Next]) -> Next:
        """Run `step` to its end even if the loop is cancelled meanwhile (`stop()` waits for it)."""
        task = asyncio.ensure_future(step)
        self._steps.add(task)

        def forget(done: asyncio.Task[Any]) -> None:
            self._steps.discard(done)
            if not done.cancelled():
                done.exception()  # seen: the loop awaiting it logs it, or the loop was stopped

        task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _pause(self, state: LoopState, delay: float) -> None:
        if self._wake_in_backoff:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await state.changed.wait()
        else:
            await self._clock.sleep_until(self._clock.now() + datetime.timedelta(seconds=delay))

    async def _wait(self, state: LoopState, until: datetime.datetime | None) -> None:
        waiters = [asyncio.ensure_future(state.changed.wait())]
        if until is not None:
            waiters.append(asyncio.ensure_future(self._clock.sleep_until(until)))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()


def agent_of(body: dict[str, Any]) -> str:
    """The name of the Agent the object's `spec.agentRef` names ("" when none)."""
    return str(((body.get("spec") or {}).get("agentRef") or {}).get("name", ""))
