"""Start every part of a local run on one bus, and stop them in reverse order."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import Bus
from rockbot.local.assembly import AssembledAgent
from rockbot.local.scheduler import LocalScheduler, Report
from rockbot.resources import ScheduledTask
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings


@dataclass
class LocalRun:
    agents: dict[str, AgentRuntime]


@contextlib.asynccontextmanager
async def running(
    *,
    bus: Bus,
    agents: dict[str, AssembledAgent],
    tasks: list[ScheduledTask],
    report: Report,
    scripts: ScriptsManagerSettings,
) -> AsyncIterator[LocalRun]:
    """The scripts-manager (local sandbox), every agent with its inbox, and the scheduler."""
    async with contextlib.AsyncExitStack() as stack:
        manager = ScriptsManager(settings=scripts, bus=bus)
        await manager.start()
        stack.push_async_callback(manager.stop)
        runtimes = {}
        for name, assembled in agents.items():
            sandbox = ScriptSandbox.for_agent(bus=bus, config=assembled.config)
            runtime = AgentRuntime.from_config(
                assembled.config, bus=bus, sandbox=sandbox, env={**os.environ, **assembled.env}
            )
            await stack.enter_async_context(runtime)
            inbox = await serve_inbox(runtime=runtime, bus=bus)
            stack.push_async_callback(inbox.close)
            runtimes[name] = runtime
        scheduler = LocalScheduler(bus=bus, tasks=tasks, report=report)
        scheduler.start()
        stack.push_async_callback(scheduler.close)
        yield LocalRun(agents=runtimes)
