"""The committed CRDs are generated from the models, and they are structural."""

from __future__ import annotations

import pathlib

import yaml

from rockbot import crdgen

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_committed_crds_match_the_models():
    rendered = crdgen.render_all()
    committed = {path.name: path.read_text() for path in (ROOT / "crds").glob("*.yaml")}
    assert committed == rendered, "crds/ drifted from rockbot/resources: run `rockbot crds --write`"


def _walk(node, path="$"):
    yield path, node
    for key in ("properties",):
        for name, child in (node.get(key) or {}).items():
            yield from _walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}[{key}]")


def test_every_schema_node_is_structural():
    for text in crdgen.render_all().values():
        crd = yaml.safe_load(text)
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert ("$ref" not in node and "anyOf" not in node) or node.get("x-kubernetes-int-or-string"), path
            assert "type" in node, f"{crd['metadata']['name']} {path} has no type"
            assert not ("properties" in node and "additionalProperties" in node), path


def test_every_kind_has_status_short_names_category_and_columns():
    for text in crdgen.render_all().values():
        crd = yaml.safe_load(text)
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert crd["spec"]["names"]["categories"] == ["rockbot"]
        assert crd["spec"]["names"]["shortNames"]
        assert [column["name"] for column in version["additionalPrinterColumns"]][-1] == "Age"


def _columns(file: str) -> dict[str, dict]:
    crd = yaml.safe_load(crdgen.render_all()[file])
    return {column["name"]: column for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]}


def test_agents_print_ready_egress_model_the_number_of_tools_and_age():
    columns = _columns("agents.rockbot.dev.yaml")
    assert list(columns) == ["Ready", "Egress", "Model", "Tools", "Age"]
    assert columns["Egress"]["jsonPath"] == '.status.conditions[?(@.type=="EgressRestricted")].status'

    # kubectl prints the first value a path finds, so a list of names showed only the first tool
    assert columns["Tools"] | {"description": None} == {
        "name": "Tools",
        "type": "integer",
        "jsonPath": ".status.toolCount",
        "description": None,
    }


def test_runs_print_when_the_last_one_started_how_it_ended_and_when_the_next_is_due():
    tasks, triggers = _columns("scheduledtasks.rockbot.dev.yaml"), _columns("triggers.rockbot.dev.yaml")
    assert list(tasks) == ["Agent", "Schedule", "Zone", "Suspend", "Last", "Outcome", "Next", "Age"]
    assert tasks["Outcome"]["jsonPath"] == triggers["Outcome"]["jsonPath"] == ".status.history[-1:].outcome"
    assert tasks["Next"]["type"] == "string"


def test_date_columns_hold_only_times_in_the_past():
    """kubectl prints a date column as an age, and a time in the future as <invalid>."""
    past = {".metadata.creationTimestamp", ".status.lastScheduleTime", ".status.lastDelivery.time",
            ".status.lastRunTime"}
    for file in crdgen.render_all():
        for column in _columns(file).values():
            assert column["type"] != "date" or column["jsonPath"] in past, (file, column)
