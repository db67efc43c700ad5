"""The operator as the chart deploys it, started as its pod would start it (see tests/pod_process.py).

The operator's container comes from `helm template` with the chart's default values: its arguments,
environment (JSON logs) and uid. What a cluster would add is given by the test: a kubeconfig for the
emulated API server in place of the service account (with its own token, so the operator's requests
can be told apart), the broker's URL in place of the bus Secret, and a free port for the health
server in place of 8080.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import yaml

from tests.kubeapi import KubeApiEmulator
from tests.pod_process import PodProcess, http_get, start, wait_until

#: The release namespace of `helm template` (the operator watches it by default).
NAMESPACE = "rockbot"
#: The bearer token in the operator's kubeconfig: its requests carry it, the test's own carry none.
OPERATOR_TOKEN = "operator-service-account"
KUBECONFIG = "/tmp/volumes/kubeconfig"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def operator_pod_spec(render: Callable[..., list[dict[str, Any]]], values: dict[str, Any] | None = None) -> dict:
    manifests = render(values or {})
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("operator")]
    return deployment["spec"]["template"]["spec"]


def kubeconfig_for(emulator: KubeApiEmulator) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "users": [{"name": "operator", "user": {"token": OPERATOR_TOKEN}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "operator"}}],
        "current-context": "emulator",
    })


class DeployedOperator:
    """A started operator process and its health server's URLs."""

    def __init__(self, process: PodProcess, *, port: int) -> None:
        self.process = process
        self.healthz = f"http://127.0.0.1:{port}/healthz"
        self.readyz = f"http://127.0.0.1:{port}/readyz"

    async def live(self) -> bool:
        answer = await http_get(self.healthz)
        return answer is not None and answer[0] == 200

    async def readiness(self) -> tuple[int, str] | None:
        return await http_get(self.readyz)

    async def wait_live(self, *, within: float = 30) -> None:
        await wait_until(self.live, within=within, what="live (/healthz 200)", process=self.process)


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
        operator_pod_spec(render, values),
        values_from={"ROCKBOT_AMQP_URL": amqp_url},
        extra_args=["--liveness", f"http://127.0.0.1:{port}/healthz"],
        extra_env={"KUBECONFIG": KUBECONFIG, **(extra_env or {})},
        files={KUBECONFIG: kubeconfig_for(emulator)},
    )
    pods.append(process)
    return DeployedOperator(process, port=port)


def operator_requests(emulator: KubeApiEmulator, since: int = 0) -> list[Any]:
    """The requests the operator made (they carry its token), after the first `since` requests."""
    return [r for r in emulator.requests[since:] if r.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}"]
