"""Prometheus metrics of the gateway, in a registry of its own (one per gateway instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.webhooks = Counter(
            "rockbot_gateway_webhook_answers", "Webhook requests answered, by HTTP status code.",
            ["code"], registry=self.registry,
        )  # fmt: skip
        self.events = Counter(
            "rockbot_gateway_event_deliveries", "Matching Kubernetes Events taken, by what they did "
            "(started, folded, seen, missed, failed...).", ["outcome"], registry=self.registry,
        )  # fmt: skip
