"""Value combinations the chart is rendered with in the tests: one per way people install it."""

from __future__ import annotations

from typing import Any

COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-broker": {
        "rabbitmq": {"enabled": False},
        "externalBroker": {"url": "amqps://rockbot:s3cret@broker.example:5671/rockbot",
                           "cidrs": ["203.0.113.10/32"], "port": 5671},
    },
    "existing-admin-secret": {
        "rabbitmq": {"enabled": False},
        "externalBroker": {"url": "amqp://broker.example:5672/", "managementURL": "https://broker.example/api/",
                           "existingSecret": "my-admin", "cidrs": ["10.20.0.0/16"]},
    },
    "openrouter-mcp": {"openrouterMcp": {"enabled": True}},
    "sandbox-options": {
        "scripts": {"runtimeClassName": "gvisor", "priorityClassName": "rockbot-scripts",
                    "allowedPackages": ["numpy", "pandas"],
                    "pool": [{"cpu": "500m", "memory": "256Mi", "size": 2}, {"cpu": "250m", "memory": "128Mi",
                                                                             "size": 0}]},
    },
    "gateway-exposed": {
        "gateway": {"replicas": 2, "tlsSecretName": "gateway-tls", "crossNamespaceEvents": True,
                    "ingress": {"enabled": True, "className": "nginx", "host": "hooks.example.com",
                                "tlsSecretName": "hooks-tls", "annotations": {"cert-manager.io/cluster-issuer": "le"}},
                    "networkPolicy": {"webhookFrom": [{"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": "ingress-nginx"}}}], "apiServerCIDRs": ["10.0.0.1/32"]}},
    },
    "gateway-off": {"gateway": {"enabled": False}},
    "observability": {
        "telemetry": {"otlpEndpoint": "http://otel-collector.monitoring:4318", "captureContent": True,
                      "collectorEgressTo": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": "monitoring"}}}]},
        "monitoring": {"podMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
                       "grafanaDashboard": {"annotations": {"grafana_folder": "rockbot"}}},
    },
    "agent-namespaces": {
        "agentNamespaces": ["team-a", "team-b"],
        "agents": {"egress": {"llmCIDRs": ["198.51.100.0/24"], "llmPorts": [443, 8443]}},
    },
    "everything": {
        "agentNamespaces": ["team-a"],
        "operator": {"watchAllNamespaces": True, "logFormat": "text",
                     "extraEnv": [{"name": "ROCKBOT_EXTRA", "value": "1"}]},
        "agents": {"egress": {"llmCIDRs": ["198.51.100.0/24"],
                              "extraRules": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}]}},
        "scripts": {"runtimeClassName": "gvisor", "concurrency": 8, "allowedPackages": ["numpy"],
                    "pool": [{"cpu": "1", "memory": "1Gi", "size": 1}]},
        "openrouterMcp": {"enabled": True},
        "rabbitmq": {"persistence": {"storageClassName": "fast", "size": "10Gi"}},
        "image": {"digest": "sha256:" + "a" * 64},
        "imagePullSecrets": [{"name": "registry"}],
    },
}
