"""Start every part of a local run, each on its own bus connection (its principal), and stop them in reverse order."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rockbot.agent.approvals import BusApprover
from rockbot.agent.inbox import serve_inbox
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import CONSOLE, LOCAL, SCRIPTS_MANAGER, Principal
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileStore
from rockbot.console.file_writes import FileWriteAnswerer
from rockbot.console.memory_store import MemoryStore
from rockbot.console.store import Store
from rockbot.local.assembly import AssembledAgent
from rockbot.local.broker import Connect
from rockbot.local.runs import NO_FILES, StoreFileKeeper, StoreHistory, StoreMemoryDesk, store_publisher
from rockbot.local.scheduler import LocalScheduler, Report
from rockbot.local.triggers import LocalTriggers, TriggerReport
from rockbot.resources import ScheduledTask
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.limits import FixedLimits
from rockbot.scripts_manager.settings import ScriptsManagerSettings

#: Where `rockbot local` serves its webhook Triggers (127.0.0.1 only: nothing outside this machine).
WEBHOOK_HOST = "127.0.0.1"


@dataclass
class LocalRun:
    agents: dict[str, AgentRuntime]
    #: The scripts-manager (its sandbox's isolation canary says whether scripts run cut off from the host).
    scripts: ScriptsManager
    #: The port webhook Triggers are served on (None without any).
    webhook_port: int | None = None
    #: The SQLite run store every turn is recorded in (None: not recorded).
    store: Store | None = None


@contextlib.asynccontextmanager
async def running(
    *,
    connect: Connect,
    agents: dict[str, AssembledAgent],
    tasks: list[ScheduledTask],
    report: Report,
    scripts: ScriptsManagerSettings,
    triggers: list[dict[str, Any]] | None = None,
    keys: dict[str, dict[str, str]] | None = None,
    trigger_report: TriggerReport | None = None,
    webhook_port: int = 0,
    runs_database: Path | None = None,
    approvals_over_bus: bool = False,
) -> AsyncIterator[LocalRun]:
    """The scripts-manager (local sandbox), every agent with its inbox, the scheduler, and the webhook Triggers
    (`triggers`, signed with `keys` from the Secret manifests) on `webhook_port`; every turn recorded in the
    SQLite run store `runs_database` (none: not recorded). With `approvals_over_bus`, agents ask for approvals
    over the bus, as in a cluster (the local console's desk answers); otherwise whoever sets their approver."""
    async with contextlib.AsyncExitStack() as stack:
        store = memories = None
        if runs_database is not None:
            store = await Store.open(url=f"sqlite:///{runs_database}")
            stack.push_async_callback(store.close)  # after every agent has sent what it recorded
            memories = MemoryStore(store=store)
            await memories.delete_expired(now=datetime.datetime.now(datetime.UTC))

        async def connected(principal: Principal):
            return await stack.enter_async_context(await connect(principal))

        if store is not None:  # the conversation files scripts name, read (and the large ones they give back, kept)
            # for the scripts-manager as the console does; chunks of a file a stopped run never completed go first
            await FileStore(store=store).delete_stale_parts(now=datetime.datetime.now(datetime.UTC))
            console = await connected(CONSOLE)
            for answerer in (FileReadAnswerer(files=FileStore(store=store), bus=console),
                             FileWriteAnswerer(files=FileStore(store=store), bus=console)):  # fmt: skip
                await answerer.start()
                stack.push_async_callback(answerer.stop)
        limits = FixedLimits({Principal.agent(namespace=a.config.namespace, name=name): a.config.script_limits
                              for name, a in agents.items()})  # the loaded Agents', as the cluster's manager has them
        manager = ScriptsManager(settings=scripts, bus=await connected(SCRIPTS_MANAGER), limits=limits)
        await manager.start()
        stack.push_async_callback(manager.stop)
        local = await connected(LOCAL)  # the scheduler's and the webhooks' (one login, their own reply queues)
        scheduler = LocalScheduler(bus=local, tasks=tasks, report=report)
        runtimes = {}
        for name, assembled in agents.items():
            bus = await connected(Principal.agent(namespace=assembled.config.namespace, name=name))
            keeper = store and StoreFileKeeper(FileStore(store=store), namespace=assembled.config.namespace, agent=name)
            sandbox = ScriptSandbox.for_agent(bus=bus, config=assembled.config, keeper=keeper or NO_FILES)
            runtime = AgentRuntime.from_config(
                assembled.config,
                bus=bus,
                sandbox=sandbox,
                env={**os.environ, **assembled.env},
                tool_sets=[scheduler.tool_set()] if assembled.scheduling else [],
                publish_runs=store and store_publisher(store, namespace=assembled.config.namespace, agent=name),
                history=store and StoreHistory(store, namespace=assembled.config.namespace, agent=name),
                memory_desk=memories and StoreMemoryDesk(memories, namespace=assembled.config.namespace, agent=name),
                approver=BusApprover(bus=bus) if approvals_over_bus else None,
            )
            await stack.enter_async_context(runtime)
            inbox = await serve_inbox(runtime=runtime, bus=bus)
            stack.push_async_callback(inbox.close)
            runtimes[name] = runtime
        scheduler.start()
        stack.push_async_callback(scheduler.close)
        port = None
        if triggers:
            served = LocalTriggers(bus=local, triggers=triggers, agents=list(agents), keys=keys or {},
                                   report=trigger_report or (lambda *_: None))  # fmt: skip
            await served.start(host=WEBHOOK_HOST, port=webhook_port)
            stack.push_async_callback(served.stop)
            port = served.port
        yield LocalRun(agents=runtimes, scripts=manager, webhook_port=port, store=store)
