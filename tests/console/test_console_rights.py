"""The console works with exactly the chart's rights on the real API server: its ServiceAccount bound to the
rendered roles reviews tokens and rights and reads Agents; it reads no Secret."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import VIEW, AccessReviewer
from rockbot.console.web.agents import agents_for
from rockbot.kube import AGENTS, SECRETS, ApiError, KubeClient
from tests.chart.conftest import Manifest, helm, render  # noqa: F401
from tests.console.conftest import Rbac, agent_body, service_account_token
from tests.fixtures.kube_real import KubeCluster, point_clients_at

VIEW_RULES = "[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}]"


@pytest.fixture
async def console_client(
    kube_admin: KubeClient, namespaces: list[str], render: Callable[..., list[Manifest]],  # noqa: F811
    rbac: Rbac, kube_cluster: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
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
    rbac.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": ours}))
    token = await service_account_token(kube_admin, namespace=home, name="rockbot-console")
    point_clients_at(kube_cluster.kubeconfig_for(token=token, path=tmp_path / "console-kubeconfig"), monkeypatch)
    try:
        async with await KubeClient.from_environment() as client:
            yield client
    finally:
        rbac.kubectl("delete", "--ignore-not-found", *(f"{m['kind'].lower()}/{m['metadata']['name']}" for m in ours))


async def test_the_charts_rights_are_enough_for_the_console(
    rbac: Rbac, console_client: KubeClient, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine, other = namespaces
    await kube_admin.create(AGENTS, body=agent_body(namespace=mine, name="visible"))
    await kube_admin.create(AGENTS, body=agent_body(namespace=other, name="elsewhere"))
    token = await service_account_token(kube_admin, namespace=mine, name="alice")
    rbac.grant(namespace=mine, user=f"system:serviceaccount:{mine}:alice", rules=VIEW_RULES, name="viewer")
    alice = await TokenReviewer(kube=console_client, ttl=0).identity(token)
    reviewer = AccessReviewer(kube=console_client, ttl=0)
    assert await reviewer.allowed(identity=alice, namespace=mine, action=VIEW)
    shown = await agents_for(kube=console_client, identity=alice, authorizer=reviewer)
    assert [(a.namespace, a.name) for a in shown if a.namespace in namespaces] == [(mine, "visible")]
    with pytest.raises(ApiError) as refused:
        await console_client.list(SECRETS, namespace=mine)
    assert refused.value.status == 403
