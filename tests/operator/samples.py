"""Sample objects for operator tests, as a person would write them."""

from __future__ import annotations

from typing import Any

from rockbot.resources import Agent


def agent_body(name: str = "analyst", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "rockbot.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": {
                "baseUrl": "https://llm.example/v1",
                "name": "gpt-test",
                "apiKeySecretRef": {"name": "llm", "key": "apiKey"},
            },
            **spec,
        },
    }


def agent(name: str = "analyst", namespace: str = "default", **spec: Any) -> Agent:
    return Agent.model_validate(agent_body(name, namespace, **spec))


def tool_body(name: str, namespace: str = "default", labels: dict[str, str] | None = None, **spec: Any) -> dict:
    spec.setdefault("description", f"The {name} tool.")
    if not any(key in spec for key in ("rest", "mcp", "script", "agent", "a2a")):
        spec["script"] = {"source": "print('hi')"}
    return {
        "apiVersion": "rockbot.dev/v1alpha1",
        "kind": "Tool",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "uid": f"uid-{name}",
            "generation": 1,
        },
        "spec": spec,
    }


ALL_SECRETS = {"llm": {"apiKey"}, "rockbot-bus": {"amqp-url"}}
