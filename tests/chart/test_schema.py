"""Bad values fail at install time with a message naming the field (values.schema.json and the chart's checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.chart.conftest import HelmError, Manifest

BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-top-level-key": ({"agentNamespace": ["team-a"]}, "Additional property agentNamespace is not allowed"),
    "unknown-nested-key": ({"operator": {"replica": 1}}, "Additional property replica is not allowed"),
    "negative-operators": ({"operator": {"replicas": -1}}, "operator.replicas"),
    "log-format": ({"operator": {"logFormat": "xml"}}, "operator.logFormat"),
    "zero-concurrency": ({"scripts": {"concurrency": 0}}, "scripts.concurrency"),
    "concurrency-as-text": ({"scripts": {"concurrency": "four"}}, "scripts.concurrency"),
    "namespace-not-dns": ({"scripts": {"namespace": "Rockbot_Scripts"}}, "scripts.namespace"),
    "agent-namespace-not-dns": ({"agentNamespaces": ["Team A"]}, "agentNamespaces.0"),
    "llm-cidr": ({"agents": {"egress": {"llmCIDRs": ["api.openai.com"]}}}, "agents.egress.llmCIDRs.0"),
    "llm-cidr-octet": ({"agents": {"egress": {"llmCIDRs": ["10.0.0.300/8"]}}}, "agents.egress.llmCIDRs.0"),
    "llm-cidr-prefix": ({"agents": {"egress": {"llmCIDRs": ["203.0.113.10/33"]}}}, "agents.egress.llmCIDRs.0"),
    "broker-cidr": ({"rabbitmq": {"enabled": False}, "externalBroker": {
        "url": "amqp://u:p@broker:5672/", "cidrs": ["10.1.2.256/24"]}}, "externalBroker.cidrs.0"),
    "broker-url-scheme": ({"rabbitmq": {"enabled": False}, "externalBroker": {"url": "http://broker"}},
                          "externalBroker.url"),
    "pull-policy": ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    "digest": ({"image": {"digest": "latest"}}, "image.digest"),
    "root-user": ({"podSecurityContext": {"runAsUser": 0}}, "podSecurityContext.runAsUser"),
    "resources-without-limits": ({"operator": {"resources": {"limits": None}}}, "operator.resources"),
    "package-with-version": ({"scripts": {"allowedPackages": ["numpy==2.0"]}}, "scripts.allowedPackages.0"),
    "pool-class-without-size": ({"scripts": {"pool": [{"cpu": "500m", "memory": "256Mi"}]}}, "scripts.pool.0"),
    "pool-memory-not-a-quantity": ({"scripts": {"pool": [{"cpu": "500m", "memory": "lots", "size": 1}]}},
                                   "scripts.pool.0.memory"),
    "no-broker-at-all": ({"rabbitmq": {"enabled": False}}, "set externalBroker.url"),
    "external-broker-without-egress": (
        {"rabbitmq": {"enabled": False}, "externalBroker": {"url": "amqp://u:p@broker:5672/"}},
        "externalBroker.cidrs is empty: agent pods could not reach the broker; set externalBroker.cidrs",
    ),
    "external-broker-without-an-administrator": (
        {"rabbitmq": {"enabled": False}, "externalBroker": {"url": "amqp://broker:5672/", "cidrs": ["10.0.0.0/8"]}},
        "externalBroker.url names no administrator",
    ),
    "gateway-public-url": ({"gateway": {"publicUrl": "hooks.example.com"}}, "gateway.publicUrl"),
    "gateway-ingress-without-host": ({"gateway": {"ingress": {"enabled": True}}},
                                     "gateway.ingress.enabled is true but gateway.ingress.host is empty"),
    "gateway-without-a-way-to-the-external-broker": (
        {"rabbitmq": {"enabled": False}, "agents": {"egress": {"enabled": False}},
         "externalBroker": {"url": "amqp://u:p@broker:5672/"}},
        "gateway.networkPolicy.enabled is true, but externalBroker.cidrs is empty",
    ),
    "scripts-namespace-shared-with-agents": (
        {"agentNamespaces": ["rockbot-scripts"]},
        'scripts.namespace "rockbot-scripts" is also a namespace where agents run',
    ),
}


@pytest.mark.parametrize("name", BAD_VALUES)
def test_bad_values_fail_naming_the_field(render: Callable[..., list[Manifest]], name: str) -> None:
    values, message = BAD_VALUES[name]
    with pytest.raises(HelmError) as failure:
        render(values)
    assert message in str(failure.value)


def test_release_in_the_scripts_namespace_is_refused(render: Callable[..., list[Manifest]]) -> None:
    with pytest.raises(HelmError, match=r"pick another scripts\.namespace"):
        render(namespace="rockbot-scripts")
