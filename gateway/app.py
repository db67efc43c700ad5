"""The gateway process: mirrors, ledger, intake, webhook server and health, started and stopped together.

The health server comes first: while the broker is unreachable, or `gateway.runs` is not provisioned
yet (the operator declares it at its start-up), the gateway is live but not ready and keeps trying;
webhooks are served once runs can be sent. It watches Triggers and Agents in its namespaces (all
when none are given), Events where some Trigger selects them, and brings each Trigger's conditions
up to date when it, its Agent or (at every resync) its Secret changes. SIGTERM stops taking
requests, lets the deliveries being recorded finish, and ends within seconds whatever the broker
or the API server do.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from rockbot.bus import AmqpBus, Bus, NoRoute
from rockbot.bus.topology import GATEWAY_RUNS
from rockbot.clock import Clock, SystemClock
from rockbot.gateway import admission, events
from rockbot.gateway.admission import Decision, Offer
from rockbot.gateway.catalog import Catalog, Entry, Key, settle, webhook_path
from rockbot.gateway.dispatch import Dispatch
from rockbot.gateway.events import EventWatch
from rockbot.gateway.intake import Intake
from rockbot.gateway.ledger import KubeLedger
from rockbot.gateway.metrics import GatewayMetrics
from rockbot.gateway.secrets import KubeKeys, Unreadable
from rockbot.gateway.settings import GatewaySettings
from rockbot.gateway.webhooks import Webhooks, WebhookServer, tls_context
from rockbot.health import STOP_STEP_SECONDS, HealthServer, Readiness, stop_within, wait_for_dependency
from rockbot.kube import AGENTS, TRIGGERS, ApiError, KubeClient, NotFound
from rockbot.kube.mirroring import mirror

log = logging.getLogger("rockbot.gateway")


class Gateway:
    """Everything one `rockbot gateway` process runs; `kube`, `bus` and `clock` are given in tests."""

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        kube: KubeClient | None = None,
        bus: Bus | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._kube = kube
        self._own_kube = kube is None
        self._bus = bus
        self._own_bus = bus is None
        self._clock = clock or SystemClock()
        self.metrics = GatewayMetrics()
        self.readiness = Readiness()
        self.readiness.check(lambda: None if self.webhook_port is not None else "not listening for webhooks yet")
        self.health = HealthServer(readiness=self.readiness, registry=self.metrics.registry)
        self.catalog = Catalog(cross_namespace_events=settings.cross_namespace_events, namespaces=settings.namespaces)
        self._keys: KubeKeys | None = None
        self._dispatch: Dispatch | None = None
        self._ledger: KubeLedger | None = None
        self._intake: Intake | None = None
        self._events: EventWatch | None = None
        self._server: WebhookServer | None = None
        self._background: list[asyncio.Task[None]] = []
        self._dirty: set[Key] = set()
        self._settling: dict[Key, asyncio.Task[None]] = {}
        self._taking: set[asyncio.Task[None]] = set()
        self._stopped = False

    @property
    def webhook_port(self) -> int | None:
        return None if self._server is None else self._server.port

    async def start(self) -> None:
        settings = self.settings
        await self.health.start(host=settings.health_host, port=settings.health_port)
        if self._kube is None:
            self._kube = await KubeClient.from_environment()
        if self._bus is None:
            if settings.amqp_url is None:
                raise ValueError("ROCKBOT_AMQP_URL is not set: the gateway needs its broker login (service.gateway)")
            url = settings.amqp_url.get_secret_value()
            self._bus = await AmqpBus.connect_when_ready(url=url, readiness=self.readiness)
        self._ledger = KubeLedger(kube=self._kube, on_written=lambda *written: self._dispatch.written(*written))
        self._dispatch = Dispatch(bus=self._bus, ledger=self._ledger, clock=self._clock, replies=GATEWAY_RUNS)
        await wait_for_dependency(
            self._dispatch.start, readiness=self.readiness, dependency=GATEWAY_RUNS.name, retry_on=(NoRoute,)
        )
        self._keys = KubeKeys(kube=self._kube)
        self._intake = Intake(catalog=self.catalog, dispatch=self._dispatch, clock=self._clock)
        self._events = EventWatch(kube=self._kube, catalog=self.catalog, on_event=self._event)
        mirrored = ((AGENTS, self._agent_changed, self._agent_deleted),
                    (TRIGGERS, self._trigger_changed, self._trigger_deleted))  # fmt: skip

        async def load() -> None:  # known before the first webhook is taken
            for namespace in settings.namespaces or [None]:
                for resource, on_upsert, _ in mirrored:
                    for item in (await kube.list(resource, namespace=namespace)).items:
                        on_upsert(item)

        kube = self._kube
        await wait_for_dependency(load, readiness=self.readiness, dependency="Kubernetes API",
                                  retry_on=(ApiError, aiohttp.ClientError, OSError))  # fmt: skip
        for namespace in settings.namespaces or [None]:
            for resource, on_upsert, on_delete in mirrored:
                watching = mirror(kube=self._kube, resource=resource, namespace=namespace,
                                  on_upsert=on_upsert, on_delete=on_delete)  # fmt: skip
                self._background.append(asyncio.create_task(watching, name=f"watch {resource.plural}"))
        self._background.append(asyncio.create_task(self._resync(), name="resync Triggers"))
        webhooks = Webhooks(catalog=self.catalog, keys=self._keys, intake=self._intake,
                            on_answer=lambda code: self.metrics.webhooks.labels(str(code)).inc())  # fmt: skip
        self._server = WebhookServer(webhooks.app())
        context = None
        if settings.tls_cert_file is not None and settings.tls_key_file is not None:
            context = tls_context(cert_file=settings.tls_cert_file, key_file=settings.tls_key_file)
        await self._server.start(host=settings.webhook_host, port=settings.webhook_port, ssl_context=context)
        log.info("gateway serving webhooks on port %s (%s), health on port %s", self._server.port,
                 "TLS" if context else "plain HTTP", self.health.port)  # fmt: skip

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._server is not None:
            await stop_within(STOP_STEP_SECONDS * 2, self._server.stop(), what="answering webhooks")
        if self._intake is not None:
            await stop_within(STOP_STEP_SECONDS, self._intake.drain(), what="recording deliveries")
        running = [*self._background, *self._settling.values(), *self._taking]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if self._events is not None:
            await self._events.stop()
        if self._dispatch is not None:
            await stop_within(STOP_STEP_SECONDS, self._dispatch.stop(), what="closing the answers' consumer")
        if self._ledger is not None:
            await stop_within(STOP_STEP_SECONDS, self._ledger.close(), what="writing statuses")
        if self._own_bus and self._bus is not None:
            await stop_within(STOP_STEP_SECONDS, self._bus.close(), what="closing the broker connection")
        if self._own_kube and self._kube is not None:
            await stop_within(STOP_STEP_SECONDS, self._kube.close(), what="closing the API client")
        await self.health.stop()

    # ---- the mirrors' callbacks

    def _trigger_changed(self, body: dict[str, Any]) -> None:
        assert self._ledger is not None
        self._ledger.observe(body)
        known = self.catalog.entries.get(_key(body))
        entry = self.catalog.upsert(body)
        if entry is None:
            log.warning("Trigger %s/%s does not parse; it is not served", *_key(body))
            return
        self._settle_soon(entry.key)
        assert self._events is not None
        if entry is not known:  # a new Trigger or generation (not our own status write): its Events may differ
            self._events.update()

    def _trigger_deleted(self, namespace: str, name: str) -> None:
        self.catalog.delete(namespace, name)
        assert self._ledger is not None and self._events is not None
        self._ledger.forget((namespace, name))
        self._events.update()

    def _agent_changed(self, body: dict[str, Any]) -> None:
        if self.catalog.set_agent(body):
            for entry in self.catalog.using_agent(*_key(body)):
                self._settle_soon(entry.key)

    def _agent_deleted(self, namespace: str, name: str) -> None:
        self.catalog.delete_agent(namespace, name)
        for entry in self.catalog.using_agent(namespace, name):
            self._settle_soon(entry.key)

    def _event(self, entry: Entry, event: events.Event) -> None:
        offer = events.offer_of(event)
        if admission.stale(entry.trigger, offer.occurred, now=self._clock.now()):
            return  # an old event listed again: nothing to decide, nothing to write
        task = asyncio.create_task(self._take_event(entry, offer, event))
        self._taking.add(task)
        task.add_done_callback(self._taking.discard)

    async def _take_event(self, entry: Entry, offer: Offer, event: events.Event) -> None:
        assert self._intake is not None
        try:
            decision: Decision = await self._intake.take(entry, offer, events.context_of(entry, event))
        except NotFound:
            return
        except ApiError as exc:  # the event is listed again when the watch resumes, and decided then
            log.warning("Trigger %s/%s could not take event %s: %s", *entry.key, offer.delivery_id, exc)
            return
        self.metrics.events.labels(decision.outcome).inc()
        if decision.outcome not in ("folded", "seen", "stale"):
            log.info("Trigger %s/%s, event %s: %s %s", *entry.key, offer.delivery_id, decision.outcome,
                     decision.run_id or decision.message)  # fmt: skip

    # ---- conditions

    def _settle_soon(self, key: Key) -> None:
        self._dirty.add(key)
        if key not in self._settling:
            self._settling[key] = asyncio.create_task(self._settle_while_dirty(key), name=f"settle {key}")

    async def _settle_while_dirty(self, key: Key) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                await self._settle(key)
        finally:
            del self._settling[key]

    async def _settle(self, key: Key) -> None:
        entry = self.catalog.entries.get(key)
        if entry is None:
            return
        assert self._keys is not None and self._ledger is not None
        secret_problem = url = None
        webhook = entry.trigger.spec.webhook
        if webhook is not None:
            path = webhook_path(namespace=key[0], name=key[1])
            url = None if self.settings.public_url is None else self.settings.public_url + path
            try:
                await self._keys.key(namespace=key[0], ref=webhook.secret_key_ref)
            except Unreadable as exc:
                secret_problem = str(exc)
        change = settle(entry, agent=self.catalog.agent(entry), secret_problem=secret_problem, url=url,
                        now=self._clock.now())  # fmt: skip
        try:
            await self._ledger.change(key, change)
        except NotFound:
            return
        except ApiError as exc:
            log.warning("could not write the conditions of Trigger %s/%s: %s; trying again at the next resync",
                        *key, exc)  # fmt: skip

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            for key in list(self.catalog.entries):
                self._settle_soon(key)


def _key(body: dict[str, Any]) -> Key:
    return body["metadata"]["namespace"], body["metadata"]["name"]

