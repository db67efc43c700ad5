"""The real thing once: kopf runs the scheduling handlers, triggers and replies cross a RabbitMQ broker."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import kopf
import pytest

from rockbot.bus import OPERATOR, AmqpBus, Principal
from rockbot.kube import KubeClient
from rockbot.operator.scheduling.handlers import register_scheduling
from rockbot.operator.settings import OperatorSettings
from tests.fixtures.kubeapi import run_kopf
from tests.fixtures.rabbitmq import Vhost
from tests.scheduling.conftest import Cluster, FakeAgent
from tests.waiting import eventually

pytestmark = pytest.mark.slow


class _Runtime:
    """What the lead's `Runtime` offers the scheduling handlers: settings and a client on kopf's loop."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.kube: KubeClient


async def test_every_second_schedule_fires_over_rabbitmq_and_completes(
    cluster: Cluster, real_kubeconfig: Path, vhost: Vhost
) -> None:
    runtime = _Runtime(OperatorSettings(amqp_url=await vhost.url(OPERATOR), namespaces=[cluster.ns]))
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def connect(**_: Any) -> None:
        runtime.kube = await KubeClient.from_environment()

    register_scheduling(registry, runtime)

    @kopf.on.cleanup(registry=registry)
    async def disconnect(**_: Any) -> None:
        await runtime.kube.close()

    await cluster.agent()
    await cluster.task(schedule="*/2 * * * * *", concurrencyPolicy="Allow", successfulRunsHistoryLimit=10)
    helper = Principal.agent(namespace=cluster.ns, name="helper")
    async with await AmqpBus.connect(url=await vhost.url(helper, called_by=[OPERATOR])) as bus:
        agent = await FakeAgent(bus=bus, namespace=cluster.ns, name="helper").start()
        try:
            async with run_kopf(registry=registry, namespaces=[cluster.ns]):

                async def three_succeeded() -> dict:
                    status = await cluster.status()
                    succeeded = [r for r in status.get("history", []) if r["outcome"] == "Succeeded"]
                    assert len(succeeded) >= 3
                    return status

                status = await eventually(three_succeeded, within=30)
        finally:
            await agent.stop()
    slots = [datetime.datetime.fromisoformat(r["scheduledTime"]) for r in status["history"]]
    assert all(slot.second % 2 == 0 for slot in slots)
    ids = [request.request_id for request in agent.received]
    assert len(ids) == len(set(ids)), "no slot was sent twice"
    assert {r["summary"] for r in status["history"] if r["outcome"] == "Succeeded"} == {"done: Write the report."}
