"""Issue 31, Tool and Agent authors are tenants, on the real API server: a REST Tool whose URL is the cloud metadata
endpoint or a Service of the cluster, and an Agent's `webBrowse.allowedNetworks: ["0.0.0.0/0"]`, are refused until a
cluster administrator opens those networks (the chart's `agents.privateNetworks`), each condition naming the fix."""

from __future__ import annotations

import ipaddress

from rockbot.kube import AGENTS, TOOLS, KubeClient
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body, tool_body
from tests.operator.test_operator_e2e import config_of, create_basics, settings
from tests.waiting import eventually

METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"


async def test_only_a_cluster_administrator_opens_the_metadata_endpoint_and_the_clusters_own_networks(
        kube: KubeClient, kube_namespace: str, as_operator: str) -> None:
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(TOOLS, namespace=ns, body=tool_body("credentials", namespace=ns, rest={"url": METADATA}))
    await kube.create(TOOLS, namespace=ns, body=tool_body("billing", namespace=ns,
                                                          rest={"url": f"http://billing.{ns}.svc:8080/invoices"}))
    await kube.create(TOOLS, namespace=ns, body=tool_body("rates", namespace=ns,
                                                          rest={"url": "https://rates.example/latest"}))
    await kube.create(AGENTS, namespace=ns, body=agent_body(
        namespace=ns, tools=["credentials", "billing", "rates"], builtinTools=["web"],
        webBrowse={"allowedNetworks": ["0.0.0.0/0", "8.8.8.0/24", "10.20.0.0/16"]}))  # 8.8.8.0/24: public, needs none

    async def statuses() -> tuple[dict[str, dict], dict, dict]:
        tools = {name: condition(await kube.get(TOOLS, namespace=ns, name=name), "Accepted")
                 for name in ("credentials", "billing", "rates")}
        agent = await kube.get(AGENTS, namespace=ns, name="analyst")
        return tools, condition(agent, "ToolsResolved"), await config_of(kube, ns, "analyst")

    async with operator_running(settings(ns)):  # the chart's default: no private network opened

        async def refused() -> None:
            tools, resolved, config = await statuses()
            assert [tools[name]["status"] for name in ("credentials", "billing", "rates")] == ["False", "False",
                                                                                               "True"]
            assert tools["credentials"]["message"] == (
                "spec.rest.url: 169.254.169.254 is a link-local address, which no Tool may reach unless a cluster "
                "administrator opens its network in the chart's agents.privateNetworks (ROCKBOT_PRIVATE_NETWORKS of "
                "the operator), e.g. 169.254.169.254/32: use a public address, or ask them to")
            assert "is a name of the cluster's Services" in tools["billing"]["message"]
            assert "agents.privateNetworks" in tools["billing"]["message"]
            problems = resolved["message"].split("; ")
            assert [p.split(" is not within")[0] for p in problems if "webBrowse" in p] == [
                f"spec.webBrowse.allowedNetworks[{n}]: {net}" for n, net in enumerate(("0.0.0.0/0", "8.8.8.0/24",
                                                                                     "10.20.0.0/16"))]
            assert all("agents.privateNetworks" in p for p in problems), problems
            assert config["web_browse"]["allowed_networks"] == []
            assert config["private_networks"] == []
            assert [tool["definition"]["function"]["name"] for tool in config["tools"]] == ["rates"]

        await eventually(refused, within=60)

    opened = settings(ns).model_copy(update={"private_networks": [ipaddress.ip_network("169.254.169.254/32"),
                                                                  ipaddress.ip_network("10.0.0.0/8")]})
    async with operator_running(opened):  # a cluster administrator opened the metadata endpoint and 10/8

        async def allowed() -> None:
            tools, resolved, config = await statuses()
            assert {name: c["status"] for name, c in tools.items()} == {"credentials": "True", "billing": "True",
                                                                        "rates": "True"}
            problems = resolved["message"].split("; ")
            assert [p.split(" is not within")[0] for p in problems if "webBrowse" in p] == [
                "spec.webBrowse.allowedNetworks[0]: 0.0.0.0/0", "spec.webBrowse.allowedNetworks[1]: 8.8.8.0/24"]
            assert config["web_browse"]["allowed_networks"] == ["10.20.0.0/16"]
            assert config["private_networks"] == ["169.254.169.254/32", "10.0.0.0/8"]

        await eventually(allowed, within=60)
