"""The operator as the chart deploys it, started as its pod would start it (see tests/pod_process.py).

The operator's container comes from `helm template` with the chart's default values: its arguments,
environment (JSON logs) and uid. What a cluster would add is given by the test: a kubeconfig for the
emulated API server in place of the service account (with its own token, so the operator's requests
can be told apart), the broker's URL in place of the bus Secret, and a free port for the health
server in place of 8080.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.kubeapi import KubeApiEmulator
from tests.pod_process import (
    KUBECONFIG,
    PodProcess,
    Probes,
    chart_pod_spec,
    free_port,
    kubeconfig_for,
    start,
    wait_until,
)

#: The release namespace of `helm template` (the operator watches it by default).
NAMESPACE = "rockbot"
#: The bearer token in the operator's kubeconfig: its requests carry it, the test's own carry none.
OPERATOR_TOKEN = "operator-service-account"


class DeployedOperator:
    """A started operator process and its probes."""

    def __init__(self, process: PodProcess, *, port: int) -> None:
        self.process = process
        self.probes = Probes(port)

    async def wait_live(self, *, within: float = 30) -> None:
        await wait_until(self.probes.live, within=within, what="live (/healthz 200)", process=self.process)


def start_operator(
    render: Callable[..., list[dict[str, Any]]],
    emulator: KubeApiEmulator,
    pods: list[PodProcess],
    *,
    amqp_url: str,
    values: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> DeployedOperator:
    port = free_port()
    process = start(
        chart_pod_spec(render(values or {}), "operator"),
        values_from={"ROCKBOT_AMQP_URL": amqp_url},
        extra_args=["--liveness", f"http://127.0.0.1:{port}/healthz"],
        extra_env={"KUBECONFIG": KUBECONFIG, **(extra_env or {})},
        files={KUBECONFIG: kubeconfig_for(emulator, token=OPERATOR_TOKEN)},
    )
    pods.append(process)
    return DeployedOperator(process, port=port)


def operator_requests(emulator: KubeApiEmulator, since: int = 0) -> list[Any]:
    """The requests the operator made (they carry its token), after the first `since` requests."""
    return [r for r in emulator.requests[since:] if r.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}"]
