"""The agent's script client on a real broker: each agent process has a reply queue of its own."""

from __future__ import annotations

import asyncio
import contextlib

from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, AmqpBus, Delivery, Principal
from rockbot.bus.topology import SCRIPT_INVOKE
from rockbot.contracts.scripts import ScriptInvokeRequest, ScriptInvokeResponse
from tests.fixtures.rabbitmq import Vhost


async def test_replicas_and_namespaces_never_get_each_others_script_replies(vhost: Vhost) -> None:
    alices = [Principal.agent(namespace=namespace, name="alice") for namespace in ("default", "other")]
    logins = [await vhost.url(principal) for principal in (SCRIPTS_MANAGER, *alices)]
    async with contextlib.AsyncExitStack() as stack:
        manager_bus, *process_buses = [
            await stack.enter_async_context(await AmqpBus.connect(url=url)) for url in (*logins[:2], *logins[1:])
        ]

        async def echo(delivery: Delivery) -> None:  # a scripts-manager that answers with who asked
            request = delivery.decode(ScriptInvokeRequest)
            await manager_bus.reply(to=delivery, body=ScriptInvokeResponse(
                request_id=request.request_id, stdout=request.script, stderr="", exit_code=0, duration_seconds=0,
            ))  # fmt: skip

        manager = await manager_bus.consume(queue=SCRIPT_INVOKE, handler=echo)
        stack.push_async_callback(manager.close)
        sandboxes = {  # two replicas of default/alice, each its own process (connection), and other/alice
            who: ScriptSandbox(bus=bus, namespace=namespace, agent="alice", start_ceiling_seconds=5)
            for who, namespace, bus in zip(("replica-1", "replica-2", "other"), ("default", "default", "other"),
                                           process_buses, strict=True)
        }
        queues = {who: (await bus.own_replies()).name for who, bus in zip(sandboxes, process_buses, strict=True)}
        assert queues == {"replica-1": "agent.default.alice.replies.0", "replica-2": "agent.default.alice.replies.1",
                          "other": "agent.other.alice.replies.0"}  # each process claimed a slot of its own

        async def calls(who: str) -> list[object]:
            return [
                await sandboxes[who].execute_python_script(
                    script=f"{who} {n}", request_id=f"{who}-{n}", timeout_seconds=1
                )
                for n in range(6)
            ]

        # Every process is listening before the others' replies start to flow.
        await asyncio.gather(*(sandbox.execute_python_script(script="warm-up", timeout_seconds=1)
                               for sandbox in sandboxes.values()))
        results = dict(zip(sandboxes, await asyncio.gather(*(calls(who) for who in sandboxes)), strict=True))
    for who, answers in results.items():
        assert all(isinstance(answer, ScriptInvokeResponse) for answer in answers), answers
        assert [answer.stdout for answer in answers] == [f"{who} {n}" for n in range(6)]
