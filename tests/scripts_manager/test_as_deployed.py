"""The scripts-manager as `helm install` runs it (tests/pod_process.py): a broker that comes late or goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from rockbot.bus import SCRIPTS_MANAGER
from rockbot.kube import NAMESPACES
from tests.chart.conftest import helm, render
from tests.fixtures.kubeapi import client_for
from tests.fixtures.rabbitmq import login_of, provision_on
from tests.pod_process import (
    KUBECONFIG,
    PodProcess,
    Probes,
    chart_pod_spec,
    kubeconfig_for,
    late_rabbitmq,
    pods,
    start,
    wait_until,
    waiting_for_the_broker,
)
from tests.ports import free_port

__all__ = ["helm", "late_rabbitmq", "pods", "render"]  # fixtures
#: How long SIGTERM may take to stop a process: a pod is killed 30 s after it by default.
STOP_WITHIN = 10.0
#: No node runs pods here, so the isolation canary (tests/scripts_manager/test_canary.py) is off: every probe empty.
CANARY_OFF = {"scripts": {"isolation": {"targets": {
    probe: [] for probe in ("clusterDns", "kubernetesApi", "broker", "metadata", "outside")}}}}


@pytest.fixture
async def scripts_namespace(kube_api) -> AsyncIterator[None]:
    async with client_for(kube_api) as client:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rockbot-scripts"}}
        await client.create(NAMESPACES, body=body)
        yield


def start_manager(render: Callable[..., list[dict[str, Any]]], kube_api, pods: list[PodProcess], *,
                  amqp_url: str) -> tuple[PodProcess, Probes]:
    port = free_port()
    process = start(
        chart_pod_spec(render(CANARY_OFF), "scripts-manager"),
        values_from={"ROCKBOT_AMQP_URL": amqp_url, "ROCKBOT_POD_NAME": "rockbot-scripts-manager-0"},
        extra_env={"KUBECONFIG": KUBECONFIG, "ROCKBOT_HEALTH_PORT": str(port)},
        files={KUBECONFIG: kubeconfig_for(kube_api, token="scripts-manager")},
    )
    pods.append(process)
    return process, Probes(port)


async def test_live_while_the_broker_is_unreachable_and_ready_once_it_answers(kube_api, scripts_namespace, render,
                                                                             pods, late_rabbitmq):
    process, probes = start_manager(render, kube_api, pods, amqp_url=login_of(late_rabbitmq, SCRIPTS_MANAGER))
    await wait_until(probes.live, within=30, what="live", process=process)
    _, reason = await wait_until(waiting_for_the_broker(probes), within=30, what="not ready, waiting for the broker",
                                 process=process)
    assert "cannot reach the broker at amqp://service.scripts-manager:***@127.0.0.1" in reason
    await asyncio.to_thread(late_rabbitmq.start)
    await provision_on(late_rabbitmq, SCRIPTS_MANAGER)
    await wait_until(probes.ready, within=30, what="ready once the broker answers", process=process)


async def test_sigterm_stops_the_manager_within_seconds_when_the_broker_is_gone(kube_api, scripts_namespace,
                                                                               render, pods, late_rabbitmq):
    await asyncio.to_thread(late_rabbitmq.start)
    await provision_on(late_rabbitmq, SCRIPTS_MANAGER)
    process, probes = start_manager(render, kube_api, pods, amqp_url=login_of(late_rabbitmq, SCRIPTS_MANAGER))
    await wait_until(probes.ready, within=30, what="ready", process=process)
    await asyncio.to_thread(late_rabbitmq.stop_server)
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"


async def test_sigterm_stops_the_manager_while_it_waits_for_the_broker(kube_api, scripts_namespace, render, pods):
    process, probes = start_manager(render, kube_api, pods, amqp_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/")
    await wait_until(waiting_for_the_broker(probes), within=30, what="waiting for the broker", process=process)
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"
