"""Pure builders: an Agent and its resolution in, the manifests of its children out.

No API calls here: every function is unit-tested on plain data. The agent pod gets no token, no
API rights, a restricted security context, and its secrets only through `valueFrom`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rockbot.contracts.agent_config import AgentConfig
from rockbot.kube.security import restricted_container_context, restricted_pod_context
from rockbot.operator.resolving import Resolution
from rockbot.operator.settings import OperatorSettings
from rockbot.resources import GROUP, VERSION, Agent
from rockbot.resources.agent import CHILD_PREFIX, CHILD_SUFFIXES
from rockbot.telemetry import CAPTURE_CONTENT_ENV

K8sObject = dict[str, Any]

CONFIG_KEY = "agent.json"
CONFIG_DIR = "/etc/rockbot"
CHECKSUM_ANNOTATION = f"{GROUP}/config-checksum"
#: Rolls the pods when the HTTP token Secret is recreated: env from a Secret is read at pod start only.
TOKEN_CHECKSUM_ANNOTATION = f"{GROUP}/http-token-checksum"
#: The same for the agent's own broker login (its bus Secret), when the operator provisions one.
BUS_CHECKSUM_ANNOTATION = f"{GROUP}/bus-checksum"
#: The generated Secret holding an agent's bearer token (also its key for signed scheduling requests).
HTTP_TOKEN_SUFFIX = "-http-token"
HTTP_TOKEN_KEY = "token"
MANAGED_BY = "rockbot-operator"
AGENT_UID = 65532
DEFAULT_RESOURCES: K8sObject = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"cpu": "1", "memory": "512Mi"},
}


def child_name(agent: Agent, suffix: str = "") -> str:
    """Children are `rockbot-<agent>` (+ suffix): recognisable, and a valid DNS-1035 label.

    The Agent CRD bounds the name so that the longest suffix still fits 63 characters.
    """
    return child_name_of(agent.metadata["name"], suffix)


def child_name_of(agent_name: str, suffix: str = "") -> str:
    """`child_name` for code that knows only the Agent's name."""
    assert suffix in CHILD_SUFFIXES, f"declare {suffix!r} in CHILD_SUFFIXES so the name bound accounts for it"
    return f"{CHILD_PREFIX}{agent_name}{suffix}"


def without_empty(value: Any) -> Any:
    """Drop empty maps, lists and strings, as the API server does (Go's `omitempty`) when it stores them.

    A desired manifest holding `limits: {}` or `value: ""` would never be contained in the live
    object, so every reconcile would write. None of our children relies on an empty value meaning
    something (like `emptyDir: {}`), which is why this can be applied to whole manifests.
    """
    if isinstance(value, dict):
        pruned = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in pruned.items() if item not in ({}, [], "")}
    if isinstance(value, list):
        return [item for item in (without_empty(item) for item in value) if item not in ({}, [], "")]
    return value


def selector_labels(agent: Agent) -> dict[str, str]:
    return {"app.kubernetes.io/name": "rockbot-agent", "app.kubernetes.io/instance": agent.metadata["name"]}


def labels(agent: Agent) -> dict[str, str]:
    return {
        **selector_labels(agent),
        "app.kubernetes.io/component": "agent",
        "app.kubernetes.io/part-of": "rockbot",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def owner_reference(agent: Agent) -> K8sObject:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Agent",
        "name": agent.metadata["name"],
        "uid": agent.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def http_token_metadata(agent: Agent) -> K8sObject:
    return _metadata(agent, child_name(agent, HTTP_TOKEN_SUFFIX))


def _metadata(agent: Agent, name: str) -> K8sObject:
    return {
        "name": name,
        "namespace": agent.metadata["namespace"],
        "labels": labels(agent),
        "ownerReferences": [owner_reference(agent)],
    }


def render_config(config: AgentConfig) -> str:
    return config.model_dump_json(indent=2) + "\n"


def config_checksum(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()


def secret_checksum(secret: K8sObject) -> str:
    """A digest of a Secret's data: it changes when the values do, and reveals nothing of them."""
    return hashlib.sha256(json.dumps(secret.get("data") or {}, sort_keys=True).encode()).hexdigest()


def build_service_account(agent: Agent) -> K8sObject:
    """An identity with no token and, by design, no Role or RoleBinding anywhere."""
    return without_empty(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(agent, child_name(agent)),
            "automountServiceAccountToken": False,
        }
    )


def build_config_map(agent: Agent, config_text: str) -> K8sObject:
    return without_empty(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(agent, child_name(agent, "-config")),
            "data": {CONFIG_KEY: config_text},
        }
    )


def build_http_token_secret(agent: Agent, token: str) -> K8sObject:
    """The bearer token guarding the agent's HTTP API; generated once, never rewritten."""
    return without_empty(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": http_token_metadata(agent),
            "type": "Opaque",
            "stringData": {HTTP_TOKEN_KEY: token},
        }
    )


def build_service(agent: Agent, settings: OperatorSettings) -> K8sObject:
    return without_empty(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(agent, child_name(agent)),
            "spec": {
                "selector": selector_labels(agent),
                "ports": [{"name": "http", "port": settings.agent_port, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )


def telemetry_env(agent: Agent, settings: OperatorSettings) -> list[K8sObject]:
    """Where the agent's traces go (nothing without an endpoint: the agent then records none)."""
    if not settings.agent_otlp_endpoint:
        return []
    env = [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": settings.agent_otlp_endpoint},
        {"name": "OTEL_RESOURCE_ATTRIBUTES", "value": f"k8s.namespace.name={agent.metadata['namespace']},"
                                                      f"k8s.deployment.name={child_name(agent)}"},
    ]
    if settings.agent_capture_content:
        env.append({"name": CAPTURE_CONTENT_ENV, "value": "true"})
    return env


def build_deployment(
    agent: Agent,
    resolution: Resolution,
    settings: OperatorSettings,
    config_text: str,
    *,
    token_checksum: str,
    bus_checksum: str = "",
) -> K8sObject:
    spec = agent.spec
    env: list[K8sObject] = [
        {"name": item.env, "valueFrom": {"secretKeyRef": {"name": item.ref.name, "key": item.ref.key}}}
        for item in resolution.secret_env
    ]
    env += telemetry_env(agent, settings)
    if settings.agent_console_url:  # where the links to a turn's files point (agent/server.py)
        env.append({"name": "ROCKBOT_CONSOLE_URL", "value": settings.agent_console_url})
    env += [entry.to_wire() for entry in spec.env]
    resources = spec.resources.to_wire() if spec.resources is not None else DEFAULT_RESOURCES
    container = {
        "name": "agent",
        "image": spec.image or settings.agent_image,
        "args": ["agent", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", "--port", str(settings.agent_port)],
        "ports": [{"name": "http", "containerPort": settings.agent_port, "protocol": "TCP"}],
        "env": env,
        "resources": resources,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 20},
        "securityContext": restricted_container_context(),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_labels = labels(agent)
    return without_empty(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(agent, child_name(agent)),
            "spec": {
                "replicas": spec.replicas,
                "selector": {"matchLabels": selector_labels(agent)},
                "template": {
                    "metadata": {
                        "labels": pod_labels,
                        "annotations": {
                            CHECKSUM_ANNOTATION: config_checksum(config_text),
                            TOKEN_CHECKSUM_ANNOTATION: token_checksum,
                            BUS_CHECKSUM_ANNOTATION: bus_checksum,
                        },
                    },
                    "spec": {
                        "serviceAccountName": child_name(agent),
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "securityContext": restricted_pod_context(uid=AGENT_UID, fs_group=True),
                        "containers": [container],
                        "volumes": [
                            {  # only our key: nothing else a ConfigMap of that name holds is ever mounted
                                "name": "config",
                                "configMap": {
                                    "name": child_name(agent, "-config"),
                                    "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
                                },
                            },
                            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                        ],
                    },
                },
            },
        }
    )
