"""The console works with exactly the chart's rights on the real API server: its ServiceAccount bound to the
rendered roles reviews tokens and rights and reads Agents; it reads no Secret."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import VIEW, AccessReviewer
from rockbot.console.web.agents import agents_for
from rockbot.kube import AGENTS, SECRETS, ApiError, KubeClient
from tests.chart.conftest import Manifest, helm, render  # noqa: F401
from tests.console.conftest import agent_body, grant, kubectl, service_account_token

VIEW_RULES = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}]"


@pytest.fixture
async def console_client(
    kube_admin: KubeClient, namespaces: list[str], render: Callable[..., list[Manifest]],  # noqa: F811
    real_cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[KubeClient]:
    """A client holding the token of a ServiceAccount bound to the chart's console roles (renamed per test)."""
    home = namespaces[0]
    rendered = render({"operator": {"watchAllNamespaces": True}}, namespace=home)
    ours = [m for m in rendered if m["kind"] in ("ClusterRole", "ClusterRoleBinding")
            and m["metadata"]["name"] in ("rockbot-console", "rockbot-console-reviews")]
    assert len(ours) == 4, [m["metadata"]["name"] for m in ours]
    for manifest in ours:
        manifest["metadata"]["name"] = manifest["metadata"]["name"].replace("rockbot-", f"{home}-")
        if manifest["kind"] == "ClusterRoleBinding":
            manifest["roleRef"]["name"] = manifest["roleRef"]["name"].replace("rockbot-", f"{home}-")
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": ours}))
    token = await service_account_token(kube_admin, namespace=home, name="rockbot-console")
    config = yaml.safe_load(await asyncio.to_thread(real_cluster.read_text))
    config["users"] = [{"name": "console", "user": {"token": token}}]
    config["contexts"] = [{"name": "console", "context": {"cluster": "k8sreal", "user": "console"}}]
    config["current-context"] = "console"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    try:
        async with await KubeClient.from_environment() as client:
            yield client
    finally:
        kubectl("delete", "--ignore-not-found", *(f"{m['kind'].lower()}/{m['metadata']['name']}" for m in ours))


async def test_the_charts_rights_are_enough_for_the_console(
    console_client: KubeClient, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine, other = namespaces
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="visible"))
    await kube_admin.create(AGENTS, body=agent_body(namespace=other, name="elsewhere"))
    token = await service_account_token(kube_admin, namespace=mine, name="alice")
    grant(namespace=mine, user=f"system:serviceaccount:{mine}:alice", rules=VIEW_RULES, name="viewer")
    alice = await TokenReviewer(kube=console_client, ttl=0).identity(token)
    rbac = AccessReviewer(kube=console_client, ttl=0)
    assert await rbac.allowed(identity=alice, namespace=mine, action=VIEW)
    shown = await agents_for(kube=console_client, identity=alice, authorizer=rbac)
    assert [(a.namespace, a.name) for a in shown if a.namespace in namespaces] == [(mine, "visible")]
    with pytest.raises(ApiError) as refused:
        await console_client.list(SECRETS, namespace=mine)
    assert refused.value.status == 403
