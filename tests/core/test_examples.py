"""The examples a user copies are valid resources."""

from __future__ import annotations

import pathlib

import yaml

from rockbot.resources.checking import MODELS

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_every_example_resource_is_valid():
    kinds = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document["apiVersion"] == "v1":  # a Secret for rockbot local
                continue
            MODELS[document["kind"]].model_validate(document)
            kinds.append(document["kind"])
    assert sorted(set(kinds)) == ["Agent", "Evaluation", "ScheduledTask", "Tool", "Trigger"]
