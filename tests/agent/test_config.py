"""The agent config a person may write by hand: out-of-range numbers are refused, naming the field."""

from __future__ import annotations

import pytest
import yaml

from rockbot.agent.cli import load_config
from tests.agent.configs import agent_config

GOOD = agent_config(llm_url="http://127.0.0.1:9/v1").model_dump(mode="json")


@pytest.mark.parametrize(("change", "field"), [
    ({"max_iterations": 0}, "max_iterations: Input should be greater than or equal to 1"),
    ({"max_iterations": 101}, "max_iterations: Input should be less than or equal to 100"),
    ({"model": {**GOOD["model"], "max_result_chars": 10}},
     "model.max_result_chars: Input should be greater than or equal to 1000"),
    ({"model": {**GOOD["model"], "max_result_chars": 10_000_000}},
     "model.max_result_chars: Input should be less than or equal to 1000000"),
    ({"model": {**GOOD["model"], "request_timeout_seconds": 0}},
     "model.request_timeout_seconds: Input should be greater than 0"),
])
def test_out_of_range_numbers_are_refused_naming_the_field(tmp_path, change, field):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **change}))
    with pytest.raises(SystemExit) as refused:
        load_config(path)
    assert f"--config {path} is not a valid agent config: {field}" in str(refused.value)


def test_the_bounds_admit_the_crd_defaults_and_edges(tmp_path):
    path = tmp_path / "agent.yaml"
    edges = {"max_iterations": 100, "model": {**GOOD["model"], "max_result_chars": 1000}}
    path.write_text(yaml.safe_dump({**GOOD, **edges}))
    config = load_config(path)
    assert (config.max_iterations, config.model.max_result_chars) == (100, 1000)
