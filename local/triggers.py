"""`rockbot local`'s gateway: the webhook Triggers of the files, served on a local port, as the gateway serves them.

The same endpoint, checks, decisions and templates (`rockbot.gateway`), with what a cluster would
hold kept in this process instead: statuses in memory, keys from the Secret manifests among the
files, every Agent of the files taken as Ready. Runs go to the agents' inboxes as `service.local`;
each answer is reported like a ScheduledTask's. Event Triggers need a cluster: they are listed at
start-up and never fire.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from rockbot.bus import Bus
from rockbot.bus.topology import service_replies
from rockbot.clock import SystemClock
from rockbot.gateway.catalog import Catalog
from rockbot.gateway.dispatch import Dispatch
from rockbot.gateway.intake import Intake
from rockbot.gateway.ledger import Key, MemoryLedger
from rockbot.gateway.secrets import FixedKeys
from rockbot.gateway.webhooks import Webhooks, WebhookServer
from rockbot.local.manifests import NAMESPACE

#: Told each run's end: (Trigger name, answer, error).
TriggerReport = Callable[[str, str | None, str | None], None]


class PortUnavailable(Exception):
    """The webhook port cannot be listened on; the message names the fix."""


class LocalTriggers:
    def __init__(
        self, *, bus: Bus, triggers: list[dict[str, Any]], agents: list[str], keys: dict[str, dict[str, str]],
        report: TriggerReport,
    ) -> None:  # fmt: skip
        """`triggers`: the webhook Triggers' manifests (checked by `manifests.load`); `agents`: the Agents' names."""
        clock = SystemClock()
        self.catalog = Catalog()
        self._ledger = MemoryLedger(on_written=lambda *written: self._dispatch.written(*written))
        for body in triggers:
            entry = self.catalog.upsert(body)
            assert entry is not None, "manifests.load admits valid Triggers only"
            self._ledger.add(entry.trigger)
        ready = {"type": "Ready", "status": "True", "reason": "Local"}
        for name in agents:
            self.catalog.set_agent({"metadata": {"namespace": NAMESPACE, "name": name},
                                    "status": {"conditions": [ready]}})  # fmt: skip

        def completed(key: Key, run: str, answer: str | None, error: str | None) -> None:
            report(key[1], answer, error)

        replies = service_replies(service="local", instance=f"triggers-{secrets.token_hex(4)}")
        self._dispatch = Dispatch(bus=bus, ledger=self._ledger, clock=clock, replies=replies, on_completed=completed)
        intake = Intake(catalog=self.catalog, dispatch=self._dispatch, clock=clock)
        self._intake = intake
        self._server = WebhookServer(Webhooks(catalog=self.catalog, keys=FixedKeys(keys), intake=intake).app())

    @property
    def port(self) -> int | None:
        return self._server.port

    async def start(self, *, host: str, port: int) -> None:
        await self._dispatch.start()
        try:
            await self._server.start(host=host, port=port)
        except OSError as exc:
            await self._dispatch.stop()
            raise PortUnavailable(f"cannot serve the webhook Triggers on {host}:{port} ({exc.strerror}): pass "
                                  "another --webhook-port (0 picks a free one)") from None  # fmt: skip

    async def stop(self) -> None:
        await self._server.stop()
        await self._intake.drain()
        await self._dispatch.stop()
