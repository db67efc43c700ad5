"""The real API server for the console's tests (the shared rig of ../shared/k8s), with fresh namespaces,
ServiceAccounts and Roles made per test, and the project's CRDs applied once.

The console is asked about RBAC the way a cluster answers it, so these tests need a real API server
(TokenReview and SubjectAccessReview are the real authenticator and authorizer's).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import AccessReviewer
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.kube import SERVICEACCOUNTS, KubeClient

K8SREAL = Path(os.environ.get("K8SREAL", "/var/tmp/k8s"))
KUBECONFIG = K8SREAL / "kubeconfig"
REPOSITORY = Path(__file__).resolve().parents[2]


def kubectl(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run([str(K8SREAL / "bin" / "kubectl"), "--kubeconfig", str(KUBECONFIG), *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@pytest.fixture(scope="session")
def real_cluster() -> Path:
    """The shared rig's kubeconfig, with the CRDs of the console's pages applied (server-side: re-applying is a
    no-op). Not the Tool CRD: the real API server refuses it today (the estimated cost of its script rule)."""
    if not KUBECONFIG.exists():
        pytest.fail(f"no real API server: {KUBECONFIG} is missing; start one with $K8SREAL/up.sh "
                    "(see ../shared/k8s/README.md)")
    kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=rockbot-console-tests",
            *(arg for kind in ("agents", "scheduledtasks", "triggers")
              for arg in ("-f", str(REPOSITORY / "crds" / f"{kind}.rockbot.dev.yaml"))))
    kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/agents.rockbot.dev")
    return KUBECONFIG


@pytest.fixture
async def kube_admin(real_cluster: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KubeClient]:
    """A client with the rig's admin rights: makes what a test needs, and serves as the console's own client."""
    monkeypatch.setenv("KUBECONFIG", str(real_cluster))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    async with await KubeClient.from_environment() as client:
        yield client


@pytest.fixture
def namespaces(real_cluster: Path) -> Iterator[list[str]]:
    """Two fresh namespaces named console-<random>-a and -b, deleted after the test."""
    stem = f"console-{uuid.uuid4().hex[:8]}"
    made = [f"{stem}-a", f"{stem}-b"]
    for name in made:
        kubectl("create", "namespace", name)
    yield made
    kubectl("delete", "namespace", *made, "--wait=false")


def grant(*, namespace: str, user: str, rules: str, name: str) -> None:
    """A Role of `rules` (YAML list) in `namespace`, bound to `user` (a full username)."""
    kubectl("apply", "-f", "-", stdin=f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: {namespace}}}
rules: {rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: User, apiGroup: rbac.authorization.k8s.io, name: "{user}"}}]
""")


async def service_account_token(kube: KubeClient, *, namespace: str, name: str) -> str:
    """A fresh ServiceAccount `name` in `namespace` and a 10-minute token of it (as `kubectl create token`)."""
    await kube.create(SERVICEACCOUNTS, namespace=namespace,
                      body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    answer = await kube.create(SERVICEACCOUNTS, namespace=namespace, name=name, subresource="token",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": 600}})
    return str(answer["status"]["token"])


@dataclass(kw_only=True)
class Console:
    """A console serving on loopback, as `rockbot console` would, with the test's admin client as its own."""

    url: str
    sessions: Sessions
    rbac: AccessReviewer


@pytest.fixture
async def console(kube_admin: KubeClient) -> AsyncIterator[Console]:
    sessions = Sessions()
    rbac = AccessReviewer(kube=kube_admin, ttl=0)  # no caching: each test changes RBAC as it goes
    gate = Gate(tokens=TokenReviewer(kube=kube_admin, ttl=0), sessions=sessions)
    runner = web.AppRunner(build_app(gate=gate, authorizer=rbac, kube=kube_admin))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Console(url=f"http://127.0.0.1:{port}", sessions=sessions, rbac=rbac)
    finally:
        await runner.cleanup()


def agent_body(*, namespace: str, name: str, description: str = "") -> dict[str, object]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "test-model"},
                     "description": description}}
