"""Agent configs for tests: a minimal valid config pointed at a scripted LLM, with overrides."""

from __future__ import annotations

from typing import Any

from rockbot.contracts.agent_config import AgentConfig

API_KEY_ENV = "TEST_MODEL_API_KEY"


def agent_config(*, llm_url: str, name: str = "helper-bot", model: dict[str, Any] | None = None, **fields: Any):
    return AgentConfig.model_validate(
        {
            "name": name,
            "namespace": "team-a",
            "model": {"base_url": llm_url, "name": "scripted-model", "api_key": {"env": API_KEY_ENV}, **(model or {})},
            "system_prompt": "You are a test agent.",
            **fields,
        }
    )
