"""Upgrades keep the generated broker passwords: helm renders against a (emulated) cluster holding the old ones."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import yaml

from rockbot.kube import KubeClient
from rockbot.kube.resources import NAMESPACES, SECRETS
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, Helm, Manifest


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _render_against(helm: Helm, kubeconfig: Path) -> list[Manifest]:
    # helm is a blocking subprocess and the emulator serves on this event loop: run helm in a thread.
    out = await asyncio.to_thread(
        helm.run, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server", kubeconfig=kubeconfig
    )
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _secret(manifests: list[Manifest], name: str, key: str) -> str:
    (secret,) = [m for m in manifests if m["kind"] == "Secret" and m["metadata"]["name"] == name]
    return base64.b64decode(secret["data"][key]).decode()


async def test_upgrade_keeps_the_password_generated_at_install(
    helm: Helm, kube_client: KubeClient, kubeconfig: Path
) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    await kube_client.create(NAMESPACES, body=namespace)
    first_install = await _render_against(helm, kubeconfig)
    generated = _secret(first_install, "rockbot-rabbitmq", "password")
    operator = _secret(first_install, "rockbot-operator-bus", "password")
    # What the first install left in the cluster:
    await kube_client.create(SECRETS, namespace=NAMESPACE, body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rockbot-rabbitmq", "namespace": NAMESPACE},
        "data": {"username": _b64("rockbot"), "password": _b64(generated)},
    })
    await kube_client.create(SECRETS, namespace=NAMESPACE, body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rockbot-operator-bus", "namespace": NAMESPACE},
        "data": {"password": _b64(operator), "amqp-url": _b64("the URL of the first install")},
    })

    upgrade = await _render_against(helm, kubeconfig)

    assert _secret(upgrade, "rockbot-rabbitmq", "password") == generated
    assert _secret(upgrade, "rockbot-operator-bus", "password") == operator
    assert f"service.operator:{operator}@" in _secret(upgrade, "rockbot-operator-bus", "amqp-url")
