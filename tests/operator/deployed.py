"""The operator as the chart deploys it, started as its pod would start it (see tests/pod_process.py).

The operator's container comes from `helm template` with the chart's default values: its arguments,
environment (JSON logs) and uid. What a cluster would add is given by the test: a kubeconfig for the
API server (the real one, or the emulator's with its own token, so the operator's requests can be told
apart) in place of the service account, the test's broker (its logins and management API) in place of the chart's
Secrets and in-cluster addresses, and a free port for the health server in place of 8080. No node runs
pods here, so the egress canary (tests/operator/test_egress_canary.py, with a node) is off unless asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rockbot.bus import CONSOLE, GATEWAY, OPERATOR, SCRIPTS_MANAGER
from tests.fixtures.rabbitmq import RabbitBroker, login_of
from tests.kubeapi import KubeApiEmulator
from tests.pod_process import (
    KUBECONFIG,
    PodProcess,
    Probes,
    chart_pod_spec,
    kubeconfig_for,
    start,
    wait_until,
)
from tests.ports import free_port

#: The release namespace of `helm template` (the operator watches it by default).
NAMESPACE = "rockbot"
#: The chart's values these runs start from: no node runs the egress canary's pods here.
CANARY_OFF = {"agents": {"egressCanary": {"enabled": False}}}
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
    emulator: KubeApiEmulator | None,
    pods: list[PodProcess],
    *,
    broker: RabbitBroker | None,
    values: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
    kubeconfig: str | None = None,
    namespace: str = NAMESPACE,
) -> DeployedOperator:
    """The operator, with `broker` as its broker (None: no broker, so no scheduling and no bus for agents).

    It reaches the emulator with `OPERATOR_TOKEN`, or any API server with the text of `kubeconfig` (a real
    one's); `namespace` is the release's, which it watches.
    """
    if kubeconfig is None:
        assert emulator is not None, "give the emulator or a kubeconfig"
        kubeconfig = kubeconfig_for(emulator, token=OPERATOR_TOKEN)
    port = free_port()
    secrets = {
        "ROCKBOT_AMQP_URL": login_of(broker, OPERATOR) if broker else "",
        "ROCKBOT_SCRIPTS_MANAGER_AMQP_URL": login_of(broker, SCRIPTS_MANAGER) if broker else "",
        "ROCKBOT_GATEWAY_AMQP_URL": login_of(broker, GATEWAY) if broker else "",
        "ROCKBOT_CONSOLE_AMQP_URL": login_of(broker, CONSOLE) if broker else "",
        "ROCKBOT_BROKER_ADMIN_USERNAME": "guest",
        "ROCKBOT_BROKER_ADMIN_PASSWORD": "guest",
    }
    addresses = {
        "ROCKBOT_BROKER_MANAGEMENT_URL": broker.management_url if broker else "",
        "ROCKBOT_BROKER_AGENT_URL": f"amqp://127.0.0.1:{broker.port}/" if broker else "",
    }
    process = start(
        chart_pod_spec(render({**CANARY_OFF, **(values or {})}, namespace=namespace), "operator"),
        values_from=secrets,
        extra_args=["--liveness", f"http://127.0.0.1:{port}/healthz"],
        extra_env={"KUBECONFIG": KUBECONFIG, **addresses, **(extra_env or {})},
        files={KUBECONFIG: kubeconfig},
    )
    pods.append(process)
    return DeployedOperator(process, port=port)


def operator_requests(emulator: KubeApiEmulator, since: int = 0) -> list[Any]:
    """The requests the operator made (they carry its token), after the first `since` requests."""
    return [r for r in emulator.requests[since:] if r.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}"]


CHILD_KINDS = [("apps", "deployments", ""), ("", "serviceaccounts", ""), ("", "services", ""),
               ("", "configmaps", "-config"), ("", "secrets", "-http-token")]


def converged(emulator: KubeApiEmulator, agents: list[str], *, namespace: str = NAMESPACE) -> bool:
    """Straight from the emulator's store (no request): exactly these Agents, each with its five children and a
    Ready=True status for its generation, and every Tool's `usedBy` naming exactly the Agents that use it."""
    return not lagging(emulator, agents, namespace=namespace)


def lagging(emulator: KubeApiEmulator, agents: list[str], *, namespace: str = NAMESPACE) -> str:
    """What is not yet as `converged` wants it (the first thing found), or '' when everything is."""
    store = emulator.api.store
    for group, plural, suffix in CHILD_KINDS:
        names = {obj["metadata"]["name"] for obj in store.items((group, plural), namespace)}
        missing = [agent for agent in agents if f"rockbot-{agent}{suffix}" not in names]
        if missing:
            return f"{len(missing)} Agents without their {plural} (e.g. {missing[0]})"
    found = {obj["metadata"]["name"]: obj for obj in store.items(("rockbot.dev", "agents"), namespace)}
    return lagging_status(found, list(store.items(("rockbot.dev", "tools"), namespace)), agents)


def lagging_status(found: dict[str, dict[str, Any]], tools: list[dict[str, Any]], agents: list[str]) -> str:
    """Of `lagging`, what the Agents' and Tools' status say (given as a watch or a store shows them)."""
    if set(found) != set(agents):
        return f"Agents {sorted(set(found) ^ set(agents))[:5]} (un)expected"
    for agent in found.values():
        status = agent.get("status") or {}
        ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready" and c["status"] == "True"]
        if not ready or status.get("observedGeneration") != agent["metadata"]["generation"]:
            return f"Agent {agent['metadata']['name']} not Ready for its generation: {status.get('conditions')}"
    for tool in tools:
        users = sorted(name for name, agent in found.items() if tool["metadata"]["name"] in agent["spec"]["tools"])
        if (tool.get("status") or {}).get("usedBy") != users:
            return f"Tool {tool['metadata']['name']}'s usedBy is not the {len(users)} Agents that use it"
    return ""


def writes_by_operator(emulator: KubeApiEmulator, since: int) -> list[str]:
    """The operator's write requests after the first `since` requests, as 'METHOD /path', with the name of
    the object a create makes (or an Event is about) after it: 'POST /api/v1/namespaces/ns/secrets name'. The
    leader election's Lease writes (taken, renewed every few seconds) are not the reconciling's and are left out."""
    found = []
    for request in operator_requests(emulator, since):
        method = str(request.method.value).upper()
        if method not in ("POST", "PUT", "PATCH", "DELETE") or "/apis/coordination.k8s.io/" in request.url.path:
            continue
        line = f"{method} {request.url.path}"
        if method == "POST":
            body = json.loads(request.body)
            line += " " + (body.get("involvedObject") or body["metadata"]).get("name", "")
        found.append(line)
    return found
