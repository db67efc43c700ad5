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


def test_agents_print_ready_model_tools_and_age():
    crd = yaml.safe_load(crdgen.render_all()["agents.rockbot.dev.yaml"])
    columns = [column["name"] for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Ready", "Model", "Tools", "Age"]
