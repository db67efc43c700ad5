"""Shared pieces for the scripts-manager tests: settings on loopback; the scripts namespace, a node, a pod backend."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from rockbot.kube import NAMESPACES, KubeClient
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.kubeapi import client_for
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import in_background
from tests.kubeapi.kubelet import Behaviour, FakeKubelet

MakeSettings = Callable[..., ScriptsManagerSettings]


@pytest.fixture
def make_settings() -> Iterator[MakeSettings]:
    # A package cache of this test's own that the scripts' user (nobody, under root) can reach: pytest's
    # temporary folders are private to the user running the tests.
    packages = Path(tempfile.mkdtemp(prefix="rockbot-test-packages-"))
    packages.chmod(0o755)

    def make(**overrides: object) -> ScriptsManagerSettings:
        values: dict[str, object] = {
            "health_host": "127.0.0.1",
            "health_port": 0,
            "scripts_backend": "local",
            "drain_seconds": 0.0,
            "scripts_package_cache": packages,
            # The canary of pod tests tries only what a test gives it (listeners of its own), never a real address.
            "scripts_isolation_targets": {},
        }
        values.update(overrides)
        return ScriptsManagerSettings(**values)  # type: ignore[arg-type]

    yield make
    shutil.rmtree(packages, ignore_errors=True)


NS = "rockbot-scripts"


@pytest.fixture
async def kube(kube_api: KubeApiEmulator, kubeconfig: Path) -> AsyncIterator[KubeClient]:
    """The test's own client (it sends no token: the manager's requests are the ones with one)."""
    async with client_for(kube_api) as client:
        await client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield client


@contextlib.asynccontextmanager
async def node(
    kube_api: KubeApiEmulator, kube: KubeClient, behaviour: Behaviour | None = None,
    relist_seconds: float | None = None, network: bool = False,
) -> AsyncIterator[FakeKubelet]:
    """A node running the scripts namespace's pods (see tests/kubeapi/kubelet.py); with `network`, one that
    does not enforce NetworkPolicy (its pods share the host's network)."""
    kubelet = FakeKubelet(emulator=kube_api, kube=kube, namespace=NS, behaviour=behaviour,
                          relist_seconds=relist_seconds, network=network)
    async with in_background(kubelet):
        yield kubelet


@contextlib.asynccontextmanager
async def pod_backend(settings: ScriptsManagerSettings) -> AsyncIterator[PodBackend]:
    """A started pod backend with its own client (from the kubeconfig, as the manager builds it)."""
    backend = PodBackend(kube=await KubeClient.from_environment(), settings=settings,
                         metrics=ScriptMetrics(backend="pods"))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like /tmp (every user may create in it), so other users' access is what it would be there."""
    path = Path(tempfile.mkdtemp(prefix="rockbot-test-shared-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
