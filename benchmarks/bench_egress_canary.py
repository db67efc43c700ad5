"""Egress canary cost at hundreds of Agents: the canary pods and API requests the operator spends.

The operator (`run_operator`, in this process, its own thread and loop as the tests run it) watches M
namespaces holding N Agents between them, each namespace with the chart's agent egress NetworkPolicy
(one policy shape; `--shapes 2` adds a policy selecting half the Agents, so two shapes a namespace).
Its API server is real: a private control plane of ../shared/k8s (tests/fixtures/kube_real, no node,
free ports, wiped after). The operator acts as a ServiceAccount of the benchmark's own namespace (bound
to cluster-admin: RBAC is checked elsewhere; here only what it asks counts), and every request it made
is counted from the API server's audit log by that user. With no node a pod stays Pending, so a
stand-in node answers each canary pod as the kubelet would once its probe ran: its container terminated
with the probe's answer (nothing reached) as the termination message, which is all the operator reads.

Printed: until every Agent shows EgressRestricted=True, the canary pods created and the operator's
requests (all, and those of the canary: pods, networkpolicies, its ServiceAccount); then, unless
`--no-steady`, one steady round (`--interval` seconds, the proofs' lifetime, with a resync every 1.5
intervals): the same again. A converge longer than the interval re-proves namespaces meanwhile.

    .venv/bin/python -m benchmarks.bench_egress_canary --agents 300 --namespaces 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rockbot.kube import AGENTS, NETWORKPOLICIES, PODS, KubeClient
from rockbot.kube.mirroring import mirror
from rockbot.operator.egress_canary import CANARY_LABEL, CONTAINER, SERVICE_ACCOUNT
from rockbot.operator.settings import OperatorSettings
from rockbot.reach_probe import RESULT_KEY
from tests.fixtures.kube_real import KubeCluster, _private_control_plane, apply_crds
from tests.operator.audit import AuditEvent, AuditLog
from tests.operator.harness import operator_running

#: What the canary tries; never contacted (the stand-in node answers for the probe).
TARGETS = {"outside": ["tcp://127.0.0.1:9"]}


def agent(index: int) -> dict[str, Any]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": f"agent-{index}"},
            "spec": {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m"}, "replicas": 0}}  # fmt: skip


def policy(name: str, selector: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name},
            "spec": {"podSelector": selector, "policyTypes": ["Egress"]}}


async def stand_in_node(client: KubeClient, answered: list[str]) -> None:
    """Answer every canary pod as the kubelet would after its probe ran: terminated, nothing reached."""
    done: set[tuple[str, str]] = set()

    async def answer(pod: dict[str, Any]) -> None:
        targets = json.loads(pod["spec"]["containers"][0]["command"][4])
        message = json.dumps({RESULT_KEY: [{"target": t, "reached": False, "detail": "stand-in"} for t in targets]})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"phase": "Succeeded", "containerStatuses": [{
            "name": CONTAINER, "image": pod["spec"]["containers"][0]["image"], "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message,
                                                        "startedAt": now, "finishedAt": now}}}]}  # fmt: skip
        with contextlib.suppress(Exception):  # deleted meanwhile
            await client.patch(PODS, namespace=pod["metadata"]["namespace"], name=pod["metadata"]["name"],
                               subresource="status", body={"status": status})
            answered.append(pod["metadata"]["namespace"])

    def seen(pod: dict[str, Any]) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["uid"])
        if key not in done and not (pod.get("status") or {}).get("containerStatuses"):
            done.add(key)
            asyncio.get_running_loop().create_task(answer(pod))

    await mirror(kube=client, resource=PODS, namespace=None, on_upsert=seen, on_delete=lambda _ns, _name: None,
                 label_selector=CANARY_LABEL)


async def all_restricted(client: KubeClient, namespaces: list[str], count: int) -> bool:
    proven = 0
    for namespace in namespaces:
        for item in (await client.list(AGENTS, namespace=namespace)).items:
            conditions = (item.get("status") or {}).get("conditions") or []
            proven += any(c["type"] == "EgressRestricted" and c["status"] == "True" for c in conditions)
    return proven == count


async def until(probe: Any, *, within: float, what: str) -> float:
    began = time.perf_counter()
    while not await probe():
        if time.perf_counter() - began > within:
            raise TimeoutError(f"{what}: not within {within:g} s")
        await asyncio.sleep(1.0)
    return time.perf_counter() - began


def of_the_canary(event: AuditEvent) -> bool:
    """The canary's requests: its pods (the operator makes no other), policies, and its own ServiceAccount."""
    return event.resource in ("pods", "networkpolicies") or (
        event.resource == "serviceaccounts" and event.name == SERVICE_ACCOUNT)


def counted(events: list[AuditEvent]) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in sorted(
        collections.Counter(f"{e.verb} {e.resource}" for e in events).items()))


def report(what: str, events: list[AuditEvent], *, agents: int) -> None:
    canary = [e for e in events if of_the_canary(e)]
    pods = sum(1 for e in canary if (e.verb, e.resource) == ("create", "pods"))
    print(f"{what}: {pods} canary pods; operator requests {len(events)} ({len(events) / agents:.1f} per Agent), "
          f"of which the canary's {len(canary)} ({len(canary) / agents:.2f} per Agent): {counted(canary)}")
    print(f"  the others: {counted([e for e in events if not of_the_canary(e)])}")


async def main(args: argparse.Namespace) -> None:
    """The benchmark, in a folder of its own (certificates, the operator's kubeconfig) removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="bench-egress-"))
    try:
        await measure(args, folder)
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)


async def measure(args: argparse.Namespace, folder: Path) -> None:
    with _private_control_plane(folder / "control-plane") as kubeconfig:
        cluster = KubeCluster(kubeconfig=kubeconfig, scratch=folder / "certs",
                              log=folder / "control-plane" / "logs" / "kube-apiserver.log", private=True)
        await asyncio.to_thread(apply_crds, cluster)
        home = f"egbench-{secrets.token_hex(3)}"
        namespaces = [f"{home}-{index}" for index in range(args.namespaces)]
        for name in (home, *namespaces):
            await asyncio.to_thread(cluster.create_namespace, name=name)
        cluster.kubectl("create", "serviceaccount", "operator", "-n", home)
        cluster.kubectl("create", "clusterrolebinding", home, "--clusterrole=cluster-admin",
                        f"--serviceaccount={home}:operator")
        token = cluster.token(namespace=home, service_account="operator", seconds=4 * 3600)
        own = cluster.kubeconfig_for(token=token, path=folder / "operator.kubeconfig")
        audit = AuditLog(folder / "control-plane" / "logs" / "audit.log", namespace=home)
        user = f"system:serviceaccount:{home}:operator"
        async with await KubeClient.from_environment(config_file=str(kubeconfig)) as client:
            for at, namespace in enumerate(namespaces):
                await client.create(NETWORKPOLICIES, namespace=namespace, body=policy(
                    "rockbot-agent-egress", {"matchLabels": {"app.kubernetes.io/name": "rockbot-agent"}}))
                if args.shapes == 2:  # half the namespace's Agents (by pod label) under one more policy
                    half = [f"agent-{i}" for i in range(at, args.agents, 2 * len(namespaces))]
                    await client.create(NETWORKPOLICIES, namespace=namespace, body=policy("half", {"matchExpressions": [
                        {"key": "app.kubernetes.io/instance", "operator": "In", "values": half}]}))
            for start in range(0, args.agents, 25):
                await asyncio.gather(*(client.create(AGENTS, namespace=namespaces[i % len(namespaces)], body=agent(i))
                                       for i in range(start, min(start + 25, args.agents))))
            answered: list[str] = []
            node = asyncio.create_task(stand_in_node(client, answered))
            os.environ["KUBECONFIG"] = str(own)  # the operator's identity; the benchmark's client is built
            settings = OperatorSettings(namespaces=namespaces, agent_image="registry.example/rockbot:bench",
                                        egress_canary=True, egress_canary_targets=TARGETS,
                                        egress_canary_interval_seconds=args.interval,
                                        resync_seconds=args.interval * 1.5, log_format="text")
            try:
                async with operator_running(settings, within=120):
                    took = await until(lambda: all_restricted(client, namespaces, args.agents), within=args.within,
                                       what="every Agent EgressRestricted=True")
                    await asyncio.sleep(5)  # the last canaries' deletes
                    first = [e for e in audit.read() if e.user == user]
                    print(f"{args.agents} Agents in {args.namespaces} namespaces, {args.shapes} policy shape(s) "
                          f"each; real API server (private control plane); load average {os.getloadavg()[0]:.1f}")
                    print(f"every Agent EgressRestricted=True after {took:.1f} s")
                    report("until then", first, agents=args.agents)
                    if args.no_steady:
                        return
                    mark = len(answered)
                    await until(lambda: _wanted(answered, mark, args.namespaces * args.shapes),
                                within=args.interval * 3 + args.within, what="a steady round of canaries")
                    await asyncio.sleep(10)  # the round's deletes, and any reconcile it caused
                    steady = [e for e in audit.read() if e.user == user][len(first):]
                    report(f"one steady round ({args.interval:g} s proofs, resync every {args.interval * 1.5:g} s)",
                           steady, agents=args.agents)
            finally:
                node.cancel()
                await asyncio.gather(node, return_exceptions=True)
        cluster.kubectl("delete", "clusterrolebinding", home, "--ignore-not-found", check=False)


async def _wanted(answered: list[str], mark: int, count: int) -> bool:
    return len(answered) - mark >= count


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=300)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--shapes", type=int, choices=(1, 2), default=1)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds a proof holds")
    parser.add_argument("--within", type=float, default=900.0, help="seconds to wait for every Agent")
    parser.add_argument("--no-steady", action="store_true", help="stop once every Agent is proven")
    asyncio.run(main(parser.parse_args()))
