"""Operator benchmark: N Agents (3 Tools each) converging, measured the way a real cluster measures it.

The operator runs as its own process, as its pod runs it (tests/pod_process.py: the chart's
settings with JSON logs, uid 65532, read-only root); a private RabbitMQ runs its scheduling and
the agents' bus identities unless --no-broker. Its API server is either
- real (`--real K8SREAL`): the control plane of ../shared/k8s in that folder (start one of your own
  with `up.sh` on other ports, see its README; no node needed). The operator acts as the chart's
  ServiceAccount with the chart's RBAC, in a namespace of its own; its requests are counted from the
  API server's audit log. With no node, pods stay Pending: a stand-in kubelet marks each new pod
  Running and Ready on a 1 s cadence (the kubelet's relist) and the real controller-manager carries
  that to the ReplicaSets and Deployments;
- or the emulator (tests/kubeapi) over HTTP with a per-request latency and its deployment controller.
Printed:
- converge: from the first Agent created until every Agent is Ready=True for its generation and every
  Tool lists its users (children counted at the end); the operator's CPU (its rusage) and API
  requests per Agent until it is quiet again;
- a restart, then a no-op resync (the restarted operator's ROCKBOT_RESYNC_SECONDS is shortened for this; the
  first one converges with the chart's 300 s): writes made (goal 0),
  how long SIGTERM took, how long the new process took to compare every Agent;
- memory: the operator's RSS once settled, and its peak;
- with --refused N (real only): N more Agents whose Services a ResourceQuota refuses, the operator's
  requests per minute while it retries them.

What bounds the time to Ready (real only): the operator makes each Agent's Deployment, then the
controller-manager's deployment controller writes ~5 times per new Deployment (its ReplicaSet, an
Event, 3-4 status updates) at its client rate limit, `--kube-api-qps` 20 by default. The converge
line therefore also prints when the operator made its last Deployment and the deployment
controller's writes per 10 s (200 is its default limit): when the operator is done long before its
Agents are Ready and the controller writes at its limit, the controller-manager bounds Ready, not
the operator. `--kcm-qps Q` restarts the control plane's own controller-manager with
`--kube-api-qps=Q --kube-api-burst=2Q` for the run (as a platform tunes it for a large cluster) and
puts the original command back afterwards; every figure of such a run is labelled with it. Run once
without and once with it to see both bounds. It refuses the shared rig (/var/tmp/k8s): use a
control plane of your own.

    PYTHONSAFEPATH=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_operator.py --agents 500 \
        --real /var/tmp/opreal-k8s [--kcm-qps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import datetime
import os
import secrets
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import kmock
import yaml

from rockbot.bus import OPERATOR, SCRIPTS_MANAGER
from rockbot.kube import AGENTS, NAMESPACES, PODS, SECRETS, TOOLS, KubeClient, Resource
from rockbot.kube.mirroring import mirror
from tests.chart.conftest import CHART, Helm, _fetch_helm
from tests.fixtures.kube_real import KubeCluster, apply_crds
from tests.fixtures.kubeapi import CRDS_DIR, apply_crd, client_for
from tests.fixtures.rabbitmq import RabbitBroker, provision_on
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import DeploymentController, in_background
from tests.operator.audit import WRITE_VERBS, AuditEvent, AuditLog
from tests.operator.deployed import (
    CHILD_KINDS,
    DeployedOperator,
    converged,
    lagging,
    lagging_status,
    operator_requests,
    start_operator,
)
from tests.pod_process import PodProcess, chart_pod_spec, http_get

#: How long without a request from the operator counts as "it has nothing left to do".
QUIET_SECONDS = 2.0
QUOTAS = Resource(group="", version="v1", plural="resourcequotas", kind="ResourceQuota", namespaced=True)
#: The shared rig of HELPERS.md: its controller-manager is never restarted by this benchmark.
SHARED_RIG = Path("/var/tmp/k8s")
#: The controller-manager's clients that carry a new Deployment to Ready, each with its own client rate limit.
CONTROLLERS = ("deployment-controller", "replicaset-controller")
_EMULATOR_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Request:
    verb: str  # as the audit log names it: get, list, watch, create, update, patch, delete
    what: str  # the resource, with its subresource: "deployments", "agents/status"

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS


class Api(Protocol):
    """What the phases need of an API server: a client, the operator's requests, and whether all converged."""

    client: KubeClient
    namespace: str

    def launch(self, env: dict[str, str] | None = None) -> DeployedOperator: ...
    def mark(self) -> int: ...
    def operator_requests(self, since: int) -> list[Request]: ...
    def others_writes(self, since: int) -> list[Request]: ...
    async def lagging(self, names: list[str]) -> str: ...


def render_chart(namespace: str) -> list[dict[str, Any]]:
    helm = Helm(binary=_fetch_helm(), home=Path(tempfile.mkdtemp(prefix="bench-helm-")))
    out = helm.run("template", "rockbot", str(CHART), "--namespace", namespace)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _secret(namespace: str, name: str, key: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "data": {key: base64.b64encode(value.encode()).decode()}}


def _agent(index: int, tools: int) -> dict[str, Any]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": f"agent-{index}"},
            "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m",
                               "apiKeySecretRef": {"name": "llm", "key": "apiKey"}},
                     "tools": [f"tool-{t}" for t in range(tools)], "builtinTools": ["scripts", "scheduling"]}}


async def until(probe: Callable[[], bool | Awaitable[bool]], *, within: float, what: str) -> float:
    started = time.perf_counter()
    while True:
        result = probe()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.perf_counter() - started
        if time.perf_counter() - started > within:
            raise TimeoutError(f"not {what} within {within} s")
        await asyncio.sleep(0.25)


async def quiet(api: Api) -> None:
    """Until the operator has made no request for QUIET_SECONDS."""
    while True:
        before = len(api.operator_requests(0))
        await asyncio.sleep(QUIET_SECONDS)
        if len(api.operator_requests(0)) == before:
            return


def summary(requests: list[Request]) -> str:
    kinds = collections.Counter(f"{r.verb} {r.what}" for r in requests)
    return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


def writes(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.write]


# ---- the emulator


class Emulated:
    def __init__(self, emulator: KubeApiEmulator, client: KubeClient, launch: Callable[..., DeployedOperator],
                 namespace: str) -> None:
        self.emulator, self.client, self.launch, self.namespace = emulator, client, launch, namespace

    def mark(self) -> int:
        return len(self.emulator.requests)

    def operator_requests(self, since: int) -> list[Request]:
        return [self._request(r) for r in operator_requests(self.emulator, since)]

    def others_writes(self, since: int) -> list[Request]:
        mine = {id(r) for r in operator_requests(self.emulator, since)}
        return [w for w in (self._request(r) for r in self.emulator.requests[since:]
                            if id(r) not in mine) if w.write]  # fmt: skip

    async def lagging(self, names: list[str]) -> str:
        return "" if converged(self.emulator, names, namespace=self.namespace) else lagging(
            self.emulator, names, namespace=self.namespace)

    @staticmethod
    def _request(request: Any) -> Request:
        path = request.url.path
        method = str(request.method.value).upper()
        what = path.split("/namespaces/")[-1].split("/")[1] if "/namespaces/" in path else path.rsplit("/", 1)[-1]
        if path.endswith("/status"):
            what += "/status"
        verb = _EMULATOR_VERBS.get(method) or ("watch" if "watch" in request.params else "get")
        return Request(verb, what)


@contextlib.asynccontextmanager
async def emulated(args: argparse.Namespace, broker: RabbitBroker | None, started: list[PodProcess],
                   env: dict[str, str]) -> AsyncIterator[Api]:
    namespace = "rockbot"
    manifests = await asyncio.to_thread(render_chart, namespace)
    emulator = KubeApiEmulator(latency=args.latency_ms / 1000)
    async with emulator, kmock.Server(emulator), client_for(emulator) as client:
        for path in sorted(CRDS_DIR.glob("*.yaml")):
            await apply_crd(client, yaml.safe_load(path.read_text()))
        await client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": namespace}})

        def launch(more: dict[str, str] | None = None) -> DeployedOperator:
            return start_operator(lambda *_, **__: manifests, emulator, started, broker=broker,
                                  extra_env={**env, **(more or {})})

        try:
            async with in_background(DeploymentController(client=client, kubelet_period=1.0)):
                yield Emulated(emulator, client, launch, namespace)
        finally:
            emulator.end_watches()


# ---- a real API server


class Real:
    def __init__(self, cluster: KubeCluster, client: KubeClient, audit: AuditLog, user: str,
                 launch: Callable[..., DeployedOperator], namespace: str) -> None:
        self.cluster, self.client, self.audit, self.user = cluster, client, audit, user
        self.launch, self.namespace = launch, namespace
        self.agents: dict[str, dict[str, Any]] = {}
        self.tools: dict[str, dict[str, Any]] = {}

    def mark(self) -> int:
        return len(self.audit.read())

    def operator_events(self, since: int) -> list[AuditEvent]:
        return [event for event in self.audit.read()[since:] if event.user == self.user]

    def operator_requests(self, since: int) -> list[Request]:
        return [Request(event.verb, event.resource) for event in self.operator_events(since)]

    def others_writes(self, since: int) -> list[Request]:
        return [Request(event.verb, event.resource) for event in self.audit.read()[since:]
                if event.user != self.user and event.write]  # fmt: skip

    async def lagging(self, names: list[str]) -> str:
        return lagging_status(self.agents, list(self.tools.values()), names)

    async def children_missing(self, names: list[str]) -> str:
        for group, plural, suffix in CHILD_KINDS:
            resource = Resource(group=group, version="v1", plural=plural, kind=plural, namespaced=True)
            found: set[str] = set()
            async for page in self.client.list_pages(resource, namespace=self.namespace, limit=500):
                found |= {item["metadata"]["name"] for item in page.items}
            missing = [name for name in names if f"rockbot-{name}{suffix}" not in found]
            if missing:
                return f"{len(missing)} Agents without their {plural} (e.g. {missing[0]})"
        return ""


async def kubelet_stand_in(client: KubeClient, namespace: str, *, period: float = 1.0) -> None:
    """Mark every new pod Running and Ready, a relist period at a time, as a node would once it ran."""
    pending: set[str] = set()
    done: set[str] = set()

    def seen(pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
        if not ready and name not in done and not pod["metadata"].get("deletionTimestamp"):
            pending.add(name)

    async def mark_ready(name: str, now: str, turns: asyncio.Semaphore) -> None:
        conditions = [{"type": kind, "status": "True", "lastTransitionTime": now}
                      for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
        async with turns:
            with contextlib.suppress(Exception):  # gone meanwhile: nothing to mark
                await client.patch(PODS, namespace=namespace, name=name, subresource="status",
                                   body={"status": {"phase": "Running", "conditions": conditions}})
                done.add(name)

    watching = asyncio.create_task(mirror(kube=client, resource=PODS, namespace=namespace, on_upsert=seen,
                                          on_delete=lambda _ns, name: pending.discard(name)))
    turns = asyncio.Semaphore(16)
    try:
        while True:
            await asyncio.sleep(period)
            batch, now = sorted(pending), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            pending.difference_update(batch)
            await asyncio.gather(*(mark_ready(name, now, turns) for name in batch))
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching


@contextlib.asynccontextmanager
async def real(args: argparse.Namespace, broker: RabbitBroker | None, started: list[PodProcess],
               env: dict[str, str]) -> AsyncIterator[Api]:
    folder = Path(args.real)
    scratch = Path(tempfile.mkdtemp(prefix="bench-real-"))
    cluster = KubeCluster(kubeconfig=folder / "kubeconfig", scratch=scratch, log=folder / "logs" /
                          "kube-apiserver.log", private=True)  # fmt: skip
    assert cluster.problem() is None, cluster.problem()
    await asyncio.to_thread(apply_crds, cluster)
    namespace = f"opbench-{secrets.token_hex(3)}"
    manifests = await asyncio.to_thread(render_chart, namespace)
    order = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    rbac = sorted((doc for doc in manifests if doc["kind"] in order), key=lambda doc: order.index(doc["kind"]))
    cluster.create_namespace(name=namespace)
    await asyncio.to_thread(cluster.kubectl, "apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    account = chart_pod_spec(manifests, "operator")["serviceAccountName"]
    token = cluster.token(namespace=namespace, service_account=account, seconds=4 * 3600)
    kubeconfig = cluster.kubeconfig_for(token=token, path=scratch / "operator.kubeconfig").read_text()
    audit = AuditLog(folder / "logs" / "audit.log", namespace=namespace)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)  # the benchmark's own client acts as admin
    with contextlib.ExitStack() as undo:
        undo.callback(cluster.delete_namespace, namespace)
        async with await KubeClient.from_environment() as client:
            def launch(more: dict[str, str] | None = None) -> DeployedOperator:
                return start_operator(lambda *_, **__: manifests, None, started, broker=broker,
                                      extra_env={**env, **(more or {})}, kubeconfig=kubeconfig)

            api = Real(cluster, client, audit, f"system:serviceaccount:{namespace}:{account}", launch, namespace)
            tasks = [asyncio.create_task(kubelet_stand_in(client, namespace))]
            for resource, held in ((AGENTS, api.agents), (TOOLS, api.tools)):
                tasks.append(asyncio.create_task(mirror(
                    kube=client, resource=resource, namespace=namespace,
                    on_upsert=lambda body, held=held: held.__setitem__(body["metadata"]["name"], body),
                    on_delete=lambda _ns, name, held=held: held.pop(name, None))))  # fmt: skip
            try:
                yield api
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)


def _kcm_command(folder: Path) -> tuple[int, list[str]]:
    """The running controller-manager of the control plane in `folder`: its pid and command line."""
    if folder.resolve() == SHARED_RIG.resolve():
        raise SystemExit(f"--kcm-qps restarts the controller-manager: not on the shared rig {SHARED_RIG}")
    pid = int((folder / "run" / "kube-controller-manager.pid").read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    command = [arg.decode() for arg in argv]
    assert Path(command[0]).name == "kube-controller-manager", f"pid {pid} is not a kube-controller-manager"
    return pid, command


def _kcm_healthy(command: list[str]) -> bool:
    port = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--secure-port="))
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=unverified, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


async def _restart_kcm(folder: Path, pid: int, command: list[str]) -> None:
    """Stop the controller-manager (by its pid) and start `command` in its place, recording the new pid."""
    os.kill(pid, signal.SIGTERM)
    await until(lambda: _gone(pid), within=60, what="the controller-manager stopped")
    await asyncio.to_thread(_start_kcm, folder, command)
    await until(lambda: _kcm_healthy(command), within=60, what="the controller-manager healthy")


def _gone(pid: int) -> bool:
    """Whether the process has exited: gone, or a zombie (one this benchmark started is its child until reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _start_kcm(folder: Path, command: list[str]) -> None:
    """Start the controller-manager detached, as up.sh does (its log appended to), and record its pid."""
    with (folder / "logs" / "kube-controller-manager.log").open("ab") as log:
        started = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # fmt: skip
    (folder / "run" / "kube-controller-manager.pid").write_text(f"{started.pid}\n")


@contextlib.asynccontextmanager
async def kcm_client_rate(folder: Path, qps: int | None) -> AsyncIterator[str]:
    """The controller-manager with `--kube-api-qps=qps` (burst twice that) while inside; its label."""
    if not qps:
        yield "controller-manager at its default client rate (--kube-api-qps 20)"
        return
    pid, original = _kcm_command(folder)
    raised = [arg for arg in original if not arg.startswith(("--kube-api-qps=", "--kube-api-burst="))]
    raised += [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"]
    await _restart_kcm(folder, pid, raised)
    try:
        yield f"controller-manager client rate RAISED: --kube-api-qps={qps} --kube-api-burst={2 * qps}"
    finally:
        await _restart_kcm(folder, _kcm_command(folder)[0], original)


def bounds(events: list[AuditEvent], *, operator: str, began: float) -> str:
    """When the operator made its last Deployment, and the controllers' writes per 10 s meanwhile."""
    start = datetime.datetime.fromtimestamp(began, datetime.UTC)
    made = [e.received for e in events if e.user == operator and e.verb == "create" and e.resource == "deployments"]
    said = [f"the operator's last Deployment created at {(max(made) - start).total_seconds():.1f} s" if made
            else "the operator created no Deployment"]  # fmt: skip
    for name in CONTROLLERS:
        user = f"system:serviceaccount:kube-system:{name}"
        windows = collections.Counter(int((e.received - start).total_seconds() // 10) for e in events
                                      if e.user == user and e.write)  # fmt: skip
        last = f", the last at {10 * max(windows) + 10} s at most" if windows else ""
        said.append(f"{name} writes {sum(windows.values())}, peak {max(windows.values(), default=0)} per 10 s{last}")
    return "; ".join(said)


# ---- the phases


async def main(args: argparse.Namespace) -> None:
    broker = None if args.no_broker else RabbitBroker(root=Path(tempfile.mkdtemp(prefix="bench-rabbit-")))
    if broker is not None:
        await asyncio.to_thread(broker.start)
    started: list[PodProcess] = []
    env = {"ROCKBOT_RESYNC_SECONDS": str(args.resync_seconds)}
    try:
        if broker is not None:
            await provision_on(broker, OPERATOR, SCRIPTS_MANAGER)  # what the chart's Secrets give them
        backend = real if args.real else emulated
        rate = kcm_client_rate(Path(args.real), args.kcm_qps) if args.real else contextlib.nullcontext("")
        async with rate as label, backend(args, broker, started, env) as api:
            args.kcm_label = label
            try:
                await prepare(api.client, api.namespace, tools=args.tools)
                await run_phases(args, api)
            finally:
                for process in started:
                    process.cleanup()
    finally:
        if broker is not None:
            await asyncio.to_thread(broker.stop)


async def prepare(client: KubeClient, namespace: str, *, tools: int) -> None:
    await client.create(SECRETS, namespace=namespace, body=_secret(namespace, "llm", "apiKey", "sk-bench"))
    for index in range(tools):
        await client.create(TOOLS, namespace=namespace, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Tool", "metadata": {"name": f"tool-{index}"},
            "spec": {"description": f"Tool {index}", "script": {"source": "print(1)"}}})


async def create_agents(api: Api, indices: range, tools: int) -> None:
    pending = [api.client.create(AGENTS, namespace=api.namespace, body=_agent(index, tools)) for index in indices]
    for batch in range(0, len(pending), 25):
        await asyncio.gather(*pending[batch:batch + 25])


async def run_phases(args: argparse.Namespace, api: Api) -> None:
    count, tools = args.agents, args.tools
    # The chart's resync period while the Agents converge: a short one re-reads every Agent's Secrets and broker
    # user each time the queue runs dry, which is no cost of converging (a pass every 30 s doubled the complete
    # reconciles at 500 once the operator kept up). The restarted operator has the short one, for the no-op resync.
    operator = api.launch({"ROCKBOT_RESYNC_SECONDS": "300"})
    await until(operator.probes.live, within=60, what="live")
    await quiet(api)
    idle_rss, _ = operator.process.memory()

    mark, cpu_before, began = api.mark(), cpu_split(operator.process.pid), time.perf_counter()
    began_wall = time.time()
    profiler = profile(operator.process.pid, args.profile) if args.profile else None
    await create_agents(api, range(count), tools)
    names = [f"agent-{index}" for index in range(count)]
    try:
        await until(lambda: _converged(api, names), within=args.within, what="converged")
    except TimeoutError:
        print(await api.lagging(names), "\n--- the operator's last lines:\n", operator.process.output()[-3000:])
        raise
    converge_seconds = time.perf_counter() - began
    await quiet(api)
    user, system = (after - before for after, before in zip(cpu_split(operator.process.pid), cpu_before, strict=True))
    cpu = user + system
    if profiler is not None:
        await stop_profile(profiler, args.profile)
    made = api.operator_requests(mark)
    rss, peak = operator.process.memory()
    timeouts = operator.process.output().count("no answer within")
    where = f"real API server ({args.real})" if args.real else f"emulator, API latency {args.latency_ms:g} ms"
    print(f"agents: {count}, tools per agent: {tools}, {where}, broker: {'no' if args.no_broker else 'yes'}")
    if args.kcm_label:
        print(args.kcm_label)
    print(f"converge: {converge_seconds:.1f} s from the first create to every Agent Ready and every Tool's usedBy")
    if isinstance(api, Real):
        print(f"  children: {await api.children_missing(names) or 'all five of every Agent there'}")
        print(f"  {bounds(api.audit.read()[mark:], operator=api.user, began=began_wall)}")
    print(f"operator CPU until quiet: {cpu:.1f} s = {1000 * cpu / count:.1f} ms per Agent "
          f"({1000 * user / count:.1f} user + {1000 * system / count:.1f} system)")
    print(f"operator API requests: {len(made)} = {len(made) / count:.1f} per Agent ({len(writes(made))} writes)")
    print(f"  {summary(made)}")
    print(f"Agent reconciles per Agent: {await reconciles(operator, count)}")
    print(f"others' writes meanwhile (test client, controllers, kubelet): {summary(api.others_writes(mark))}")
    warnings = sum(1 for record in operator.process.records() if record.get("level") in ("WARNING", "ERROR"))
    print(f"client-side timeouts in the operator's log: {timeouts}; warnings and errors logged: {warnings}")
    print(f"memory: RSS {rss / 2**20:.0f} MiB settled ({idle_rss / 2**20:.0f} MiB before the Agents), "
          f"peak {peak / 2**20:.0f} MiB")

    operator.process.terminate()
    stopping = time.perf_counter()
    code = await operator.process.exited(within=60)
    stop_seconds = time.perf_counter() - stopping
    mark, restarted = api.mark(), time.perf_counter()
    operator = api.launch()
    compared = await until(lambda: "reconciled every Agent" in operator.process.output(), within=args.within,
                           what="every Agent compared after the restart")
    await quiet(api)
    restart = api.operator_requests(mark)
    rss, peak = operator.process.memory()
    print(f"SIGTERM: exited {code} after {stop_seconds:.1f} s")
    print(f"restart: every Agent compared within {compared:.1f} s of the start "
          f"({time.perf_counter() - restarted:.1f} s until quiet); {len(restart)} requests, "
          f"{len(writes(restart))} writes {summary(writes(restart))}")
    print(f"memory after the restart: RSS {rss / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")
    if args.resync_seconds < 3600:
        mark = api.mark()
        passes = operator.process.output().count("resync: compared")
        waited = await until(lambda: operator.process.output().count("resync: compared") > passes,
                             within=args.resync_seconds + args.within, what="a resync pass")
        await quiet(api)
        resync = writes(api.operator_requests(mark))
        print(f"no-op resync (ROCKBOT_RESYNC_SECONDS={args.resync_seconds:g}, pass seen after {waited:.1f} s): "
              f"{len(resync)} writes {summary(resync)}")
    if args.refused and isinstance(api, Real):
        operator.process.terminate()
        await operator.process.exited(within=60)
        operator = api.launch({"ROCKBOT_RESYNC_SECONDS": "300"})  # the chart's: resyncs are not retries
        await until(lambda: "reconciled every Agent" in operator.process.output(), within=args.within,
                    what="every Agent compared after the restart")
        await quiet(api)
        await refused_phase(args, api, operator)


def cpu_split(pid: int) -> tuple[float, float]:
    """The process's CPU seconds so far, (user, system): system time is mostly its sockets' (loopback TCP, TLS)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


async def reconciles(operator: DeployedOperator, count: int) -> str:
    """The operator's Agent reconciles by work (its /metrics), per Agent."""
    answer = await http_get(f"{operator.probes.base}/metrics")
    found: dict[str, float] = {}
    for line in (answer[1] if answer is not None else "").splitlines():
        if line.startswith("rockbot_operator_agent_reconciles_total{"):
            work = line.split('work="', 1)[1].split('"', 1)[0]
            found[work] = float(line.rsplit(" ", 1)[1])
    return ", ".join(f"{value / count:.2f} {work}" for work, value in sorted(found.items())) or "none counted"


def profile(pid: int, output: str) -> subprocess.Popen[bytes]:
    """py-spy sampling the operator (without pausing it) until `stop_profile`, only while it holds the GIL (its
    Python CPU, not its waits); collapsed stacks in `output`."""
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "50", "--nonblocking", "--gil",
                             "--format", "raw", "--output", output], stdout=subprocess.DEVNULL)


async def stop_profile(profiler: subprocess.Popen[bytes], output: str) -> None:
    profiler.send_signal(signal.SIGINT)
    await asyncio.to_thread(profiler.wait, 60)
    print(f"profile of the converge phase (py-spy, collapsed stacks): {output}")


async def _converged(api: Api, names: list[str]) -> bool:
    return not await api.lagging(names)


async def refused_phase(args: argparse.Namespace, api: Real, operator: DeployedOperator) -> None:
    """More Agents whose Services the API server refuses (a quota of the Services there are): requests per minute,
    with the chart's resync period (300 s)."""
    await api.client.create(QUOTAS, namespace=api.namespace, body={
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-more-services"},
        "spec": {"hard": {"services": str(args.agents)}}})

    async def counted() -> bool:
        quota = await api.client.get(QUOTAS, namespace=api.namespace, name="no-more-services")
        return "services" in ((quota.get("status") or {}).get("used") or {})

    await until(counted, within=120, what="the quota counted")
    mark, began = api.mark(), time.time()
    await create_agents(api, range(args.agents, args.agents + args.refused), args.tools)
    await asyncio.sleep(args.refused_minutes * 60)
    started = [event.received.timestamp() for event in api.operator_events(mark)]
    made = api.operator_requests(mark)
    minutes = [sum(1 for when in started if began + 60 * m <= when < began + 60 * (m + 1))
               for m in range(int(args.refused_minutes))]
    failures = operator.process.output().count("retrying in")
    print(f"refused: {args.refused} more Agents whose Service a quota refuses, watched {args.refused_minutes:g} min: "
          f"{len(made)} requests, per minute {minutes}; {failures} failed reconciles logged")
    print(f"  {summary(made)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--tools", type=int, default=3)
    parser.add_argument("--real", metavar="K8SREAL", help="a control plane's folder (../shared/k8s up.sh)")
    parser.add_argument("--latency-ms", type=float, default=3.0, help="emulator: per API request (default: 3)")
    parser.add_argument("--resync-seconds", type=float, default=30.0,
                        help="the operator's resync period for the no-op resync (3600: skip it)")
    parser.add_argument("--within", type=float, default=600.0, help="give up waiting after this many seconds")
    parser.add_argument("--no-broker", action="store_true", help="run without RabbitMQ (scheduling off)")
    parser.add_argument("--refused", type=int, default=0, help="real: this many more Agents whose Service is refused")
    parser.add_argument("--profile", metavar="FILE", help="py-spy the operator while it converges (py-spy on PATH)")
    parser.add_argument("--refused-minutes", type=float, default=3.0, help="how long to watch them")
    parser.add_argument("--kcm-qps", type=int, help="real: restart the control plane's controller-manager with this "
                        "--kube-api-qps (burst twice that) for the run; figures labelled so (not on the shared rig)")
    asyncio.run(main(parser.parse_args()))
