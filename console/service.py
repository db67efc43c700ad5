"""The `rockbot console` process: the run store, its writer and history answers on the bus, and the HTTP side
(the console's pages, chat, approvals and the runs' read API, behind one gate), with health and metrics on a
port of their own.

In a cluster the console reviews tokens and rights with the API server (its ServiceAccount); the
database and the broker may come up after it: until they do, readiness says which it waits for.
"""

from __future__ import annotations

import asyncio
import datetime
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from rockbot.bus import AmqpBus, Bus
from rockbot.console.api import add_run_routes
from rockbot.console.approvals import ApprovalDesk, event_on_agent
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import ProxyHeaders, TokenReviewer
from rockbot.console.authorization import AccessReviewer
from rockbot.console.chat import ChatRelay
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileStore
from rockbot.console.file_writes import FileWriteAnswerer
from rockbot.console.files import FileAnswerer
from rockbot.console.memories import MemoryAnswerer
from rockbot.console.memory_store import MemoryCeilings, MemoryStore
from rockbot.console.recording import HistoryAnswerer, RecorderMetrics, RunWriter, WriterLimits
from rockbot.console.replay import Replayer
from rockbot.console.settings import ConsoleSettings
from rockbot.console.store import Store, StoreUnavailable, redacted
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.health import STOP_STEP_SECONDS, HealthServer, Readiness, stop_within, wait_for_dependency
from rockbot.kube import KubeClient
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Console:
    def __init__(self, *, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.readiness = Readiness()
        self._started = False  # ready only once everything start() sets up answers (the Service sends it traffic)
        self.readiness.check(lambda: None if self._started else "starting: pages, run writer and chat not all up yet")
        self.registry = CollectorRegistry()
        self.metrics = RecorderMetrics(self.registry)
        self.health = HealthServer(readiness=self.readiness, registry=self.registry)
        self.store: Store | None = None
        self.bus: Bus | None = None
        self.kube: KubeClient | None = None
        self._writer: RunWriter | None = None
        self._history: HistoryAnswerer | None = None
        self.memories: MemoryStore | None = None
        self._memory_answers: MemoryAnswerer | None = None
        self._file_answers: FileAnswerer | None = None
        self._file_reads: FileReadAnswerer | None = None
        self._file_writes: FileWriteAnswerer | None = None
        self.desk: ApprovalDesk | None = None
        self.chat: ChatRelay | None = None
        self._http: web.AppRunner | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        settings = self.settings
        await self.health.start(host=settings.health_host, port=settings.health_port)
        url = settings.database_url.get_secret_value()
        log.info("opening the run store at %s", redacted(url))
        self.store = await wait_for_dependency(
            lambda: Store.open(url=url), readiness=self.readiness, dependency="database", retry_on=(StoreUnavailable,)
        )
        self.memories = MemoryStore(store=self.store, ceilings=MemoryCeilings(
            items_per_agent=settings.memory_max_items_per_agent, bytes_per_agent=settings.memory_max_bytes_per_agent))
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="retention")
        if settings.serve_http:
            await self._serve_http()
        if settings.amqp_url is not None:
            self.bus = await AmqpBus.connect_when_ready(url=settings.amqp_url.get_secret_value(),
                                                        readiness=self.readiness)  # fmt: skip
            limits = WriterLimits(events_per_second=settings.events_per_second, burst_events=settings.burst_events)
            self._writer = RunWriter(store=self.store, bus=self.bus, readiness=self.readiness, metrics=self.metrics,
                                     limits=limits)  # fmt: skip
            await self._writer.start()
            self._history = HistoryAnswerer(store=self.store, bus=self.bus, metrics=self.metrics)
            await self._history.start()
            self._memory_answers = MemoryAnswerer(memories=self.memories, bus=self.bus)
            await self._memory_answers.start()
            self._file_answers = FileAnswerer(files=FileStore(store=self.store), bus=self.bus)
            await self._file_answers.start()
            self._file_reads = FileReadAnswerer(files=FileStore(store=self.store), bus=self.bus)
            await self._file_reads.start()
            self._file_writes = FileWriteAnswerer(files=FileStore(store=self.store), bus=self.bus)
            await self._file_writes.start()
            if self.desk is not None:
                await self.desk.start(bus=self.bus)
            if self.chat is not None:
                await self.chat.start(bus=self.bus)
        self._started = True
        log.info("console ready (pages, read API, approvals and chat: %s)", "on" if settings.serve_http else "off")

    async def _serve_http(self) -> None:
        """The console's pages, approvals and the runs' read API, behind one gate that asks the cluster who and what."""
        assert self.store is not None
        settings = self.settings
        self.kube = await KubeClient.from_environment()
        gate = Gate(
            tokens=TokenReviewer(kube=self.kube, ttl=settings.auth_cache_seconds), sessions=Sessions(),
            proxy=ProxyHeaders(trusted=settings.auth_proxy_cidrs) if settings.auth_proxy_cidrs else None,
        )  # fmt: skip
        authorizer = AccessReviewer(kube=self.kube, ttl=settings.auth_cache_seconds)
        self.desk = ApprovalDesk(on_pending=event_on_agent(self.kube))
        if settings.amqp_url is not None:  # chat goes over the bus, as the console's own login
            self.chat = ChatRelay(timeout_seconds=settings.chat_timeout_seconds, store=self.store)
        app = build_app(gate=gate, authorizer=authorizer, kube=self.kube, desk=self.desk, store=self.store,
                        trace_url_template=settings.trace_url_template, chat=self.chat, memories=self.memories)
        add_run_routes(app, store=self.store, authorizer=authorizer,
                       replayer=None if self.chat is None else Replayer(relay=self.chat, store=self.store))
        self._http = web.AppRunner(app, access_log=None)
        await self._http.setup()
        await web.TCPSite(self._http, host=settings.http_host, port=settings.http_port).start()

    async def stop(self) -> None:
        if self._writer is not None:
            await stop_within(STOP_STEP_SECONDS, self._writer.stop(), what="the run writer")
        if self._history is not None:
            await stop_within(STOP_STEP_SECONDS, self._history.stop(), what="the history answers")
        if self._memory_answers is not None:
            await stop_within(STOP_STEP_SECONDS, self._memory_answers.stop(), what="the memory answers")
        if self._file_answers is not None:
            await stop_within(STOP_STEP_SECONDS, self._file_answers.stop(), what="the file answers")
        if self._file_reads is not None:
            await stop_within(STOP_STEP_SECONDS, self._file_reads.stop(), what="the file reads")
        if self._file_writes is not None:
            await stop_within(STOP_STEP_SECONDS, self._file_writes.stop(), what="the file writes")
        if self.desk is not None:
            await stop_within(STOP_STEP_SECONDS, self.desk.stop(), what="handing pending approvals back")
        if self.chat is not None:
            await stop_within(STOP_STEP_SECONDS, self.chat.stop(), what="the chat relay")
        if self.bus is not None:
            await stop_within(STOP_STEP_SECONDS, self.bus.close(), what="closing the broker connection")
        await cancel_and_wait(self._sweeper)
        if self._http is not None:
            await stop_within(STOP_STEP_SECONDS, self._http.cleanup(), what="the HTTP server")
        if self.kube is not None:
            await self.kube.close()
        if self.store is not None:
            await self.store.close()
        await self.health.stop()

    async def _sweep_forever(self) -> None:
        assert self.store is not None and self.memories is not None
        while True:
            try:
                now = datetime.datetime.now(datetime.UTC)
                deleted = await self.store.delete_expired(now=now)
                if deleted:
                    log.info("deleted %d runs past their retention", deleted)
                forgotten = await self.memories.delete_expired(now=now)
                if forgotten:
                    log.info("deleted %d memories past their retention", forgotten)
                if parts := await FileStore(store=self.store).delete_stale_parts(now=now):
                    log.info("deleted %d chunks of script files never completed (their writer stopped)", parts)
            except StoreUnavailable as exc:
                log.warning("retention sweep skipped: %s", exc)
            await asyncio.sleep(self.settings.retention_sweep_seconds)
