"""The examples a user copies are valid: every resource parses, and the local config loads."""

from __future__ import annotations

import pathlib

import yaml

from rockbot.contracts.agent_config import AgentConfig
from rockbot.resources import Agent, ScheduledTask, Tool

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
MODELS = {"Agent": Agent, "Tool": Tool, "ScheduledTask": ScheduledTask}


def test_every_example_resource_is_valid():
    kinds = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            MODELS[document["kind"]].model_validate(document)
            kinds.append(document["kind"])
    assert sorted(set(kinds)) == ["Agent", "ScheduledTask", "Tool"]


def test_the_local_agent_config_loads():
    config = AgentConfig.model_validate_json((EXAMPLES / "local-agent.json").read_text())
    assert config.http_token is not None and config.model.api_key is not None
