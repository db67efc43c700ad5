"""Kubernetes-event Triggers: a burst of one Warning event wakes the agent once per de-duplication window."""

from __future__ import annotations

from rockbot.clock import ManualClock
from rockbot.gateway.app import Gateway
from tests.fixtures.llm import Turn
from tests.gateway.conftest import Cluster, StartGateway
from tests.waiting import eventually

EXPLAIN = ("{{ event.involvedObject.kind }} {{ event.involvedObject.name }}: {{ event.reason }} "
           "({{ event.count }} times): {{ event.message }}")  # fmt: skip


def outcomes(gateway: Gateway) -> dict[str, float]:
    return {sample.labels["outcome"]: sample.value for metric in gateway.metrics.events.collect()
            for sample in metric.samples if sample.name.endswith("_total")}  # fmt: skip


async def taken(gateway: Gateway, total: int) -> dict[str, float]:
    async def probe() -> dict[str, float]:
        counted = outcomes(gateway)
        assert sum(counted.values()) == total, counted
        return counted

    return await eventually(probe)


async def test_a_burst_of_one_warning_event_wakes_the_agent_once_per_window(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway, clock: ManualClock
) -> None:
    scripted_llm.play(Turn(text="web-1 crash-loops: its config map is missing."), Turn(text="Still crash-looping."))
    await cluster.agent()
    await cluster.trigger("crashes", prompt=EXPLAIN,
                          kubernetesEvents={"reason": "BackOff|CrashLoop", "deduplicationWindowSeconds": 300})
    await cluster.event("web-1.unrelated", count=1, at=clock.now(), reason="Pulled")
    gateway = await start_gateway(clock=clock)
    await cluster.ready("crashes")
    for count in range(1, 51):  # the kubelet reporting the same back-off fifty times
        await cluster.event("web-1.17a9", count=count, at=clock.now())
    assert await taken(gateway, 50) == {"started": 1, "folded": 49}
    (record,) = await cluster.history(["Succeeded"], name="crashes")
    assert record["deliveryId"].endswith("/1")
    assert scripted_llm.requests[0].messages[-1]["content"].startswith("Pod web-1: BackOff (1 times): Back-off")
    clock.advance(299)
    await cluster.event("web-1.17a9", count=51, at=clock.now())
    assert (await taken(gateway, 51))["folded"] == 50
    clock.advance(2)  # the window has passed: the next occurrence is a new run
    await cluster.event("web-1.17a9", count=52, at=clock.now())
    assert await taken(gateway, 52) == {"started": 2, "folded": 50}
    await cluster.history(["Succeeded", "Succeeded"], name="crashes")
    assert len(scripted_llm.requests) == 2
