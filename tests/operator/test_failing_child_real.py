"""A child the real API server refuses: the Agent says why, and the operator tries again less and less often.

A ResourceQuota of zero Services makes the API server refuse the Agent's Service (403, exceeded
quota), as a full Service range or an admission webhook would. The API server's audit log shows
each attempt. Before, a failing Agent was retried on a short fixed ladder, and 250 of them made
9,301 requests in four minutes.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import itertools
from typing import Any

from rockbot.kube import AGENTS, SECRETS, KubeClient, Resource
from rockbot.operator.settings import OperatorSettings
from rockbot.operator.workqueue import RETRIES_PER_SECOND
from tests.fixtures.kube_real import KubeCluster
from tests.operator.audit import AuditLog
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body

QUOTAS = Resource(group="", version="v1", plural="resourcequotas", kind="ResourceQuota", namespaced=True)
AGENTS_REFUSED = 8
ATTEMPTS = 3  # per Agent: its news, then two retries


def attempts(audit: AuditLog, *, resource: str, verb: str) -> dict[str, list[datetime.datetime]]:
    """When the API server received each `verb` of `resource`, by object name."""
    found: dict[str, list[datetime.datetime]] = {}
    for event in audit.read():
        if event.verb == verb and event.resource == resource:
            found.setdefault(event.name, []).append(event.received)
    return found


async def until(probe: Any, *, within: float, what: str) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            result = await probe()
        except AssertionError:
            result = None
        if result:
            return result
        assert asyncio.get_running_loop().time() < deadline, f"not {what} within {within} s"
        await asyncio.sleep(0.5)


async def test_services_the_server_refuses_are_retried_with_growing_paced_pauses_and_each_agent_says_why(
    kube_cluster: KubeCluster, kube_namespace: str, real_kube_client: KubeClient
):
    kube, ns = real_kube_client, kube_namespace
    audit = AuditLog(kube_cluster.kubeconfig.parent / "logs" / "audit.log", namespace=ns)
    await kube.create(QUOTAS, namespace=ns, body={"apiVersion": "v1", "kind": "ResourceQuota",
                                                  "metadata": {"name": "no-services"},
                                                  "spec": {"hard": {"services": "0"}}})

    async def quota_counted() -> bool:  # the quota controller has counted: refusals now say "exceeded quota"
        quota = await kube.get(QUOTAS, namespace=ns, name="no-services")
        return "services" in ((quota.get("status") or {}).get("used") or {})

    await until(quota_counted, within=60, what="the quota's usage counted by the controller-manager")
    await kube.create(SECRETS, namespace=ns, body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm"},
                                                   "data": {"apiKey": base64.b64encode(b"sk-test").decode()}})
    names = [f"agent-{index}" for index in range(AGENTS_REFUSED)]
    for name in names:
        await kube.create(AGENTS, namespace=ns, body=agent_body(name, namespace=ns))
    settings = OperatorSettings(namespaces=[ns], agent_image="registry.example/rockbot:test", resync_seconds=3600)
    async with operator_running(settings):

        async def tried_enough() -> bool:
            tried = attempts(audit, resource="services", verb="create")
            return all(len(tried.get(f"rockbot-{name}", [])) >= ATTEMPTS for name in names)

        await until(tried_enough, within=120, what=f"{ATTEMPTS} attempts to create each Agent's Service")
    for name in names:
        ready = condition(await kube.get(AGENTS, namespace=ns, name=name), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ReconcileFailed"), ready
        assert "403" in ready["message"] and "exceeded quota: no-services" in ready["message"], ready["message"]
    tried = attempts(audit, resource="services", verb="create")
    for name in names:  # each Agent: 1 s, 2 s, ... at least between attempts (the first is the Agent's news)
        gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(tried[f"rockbot-{name}"])]
        assert all(gap >= 2**index * 0.95 for index, gap in enumerate(gaps)), (name, gaps)
    # All Agents together: retries start at most RETRIES_PER_SECOND a second (one spacing spare for the
    # workers' pick-up), however many fail; at a fixed pause per Agent they all came back at once.
    retries = sorted(when for times in tried.values() for when in times[1:])
    spread = (retries[-1] - retries[0]).total_seconds()
    assert spread >= (len(retries) - 2) / RETRIES_PER_SECOND, (spread, len(retries))
    # An attempt reads the Agent's token Secret again (a failure may have come from it), and no more.
    secrets_read = attempts(audit, resource="secrets", verb="get")
    for name in names:
        assert len(secrets_read[f"rockbot-{name}-http-token"]) <= len(tried[f"rockbot-{name}"]), secrets_read
