"""NOTES.txt renders for every value set and tells the user what to do next.

`helm template` never renders NOTES.txt, so a copy of the chart renders it through `tpl` instead.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.chart.combinations import COMBINATIONS
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, Helm

NOTES_PROBE = 'notes: {{ tpl (.Files.Get "NOTES.source") . | toJson }}\n'


@pytest.fixture(scope="module")
def notes(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict], str]:
    chart = tmp_path_factory.mktemp("notes") / "rockbot"
    shutil.copytree(CHART, chart)
    (chart / "NOTES.source").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "notes-probe.yaml").write_text(NOTES_PROBE)

    def _notes(values: dict) -> str:
        values_file = Path(chart) / "values-under-test.json"
        values_file.write_text(json.dumps(values))
        out = helm.run("template", RELEASE, str(chart), "--namespace", NAMESPACE, "--values", str(values_file),
                       "--show-only", "templates/notes-probe.yaml")
        return yaml.safe_load(out)["notes"]

    return _notes


@pytest.mark.parametrize("name", COMBINATIONS)
def test_notes_render_and_say_what_to_apply_next(notes: Callable[[dict], str], name: str) -> None:
    text = notes(COMBINATIONS[name])
    assert f"kubectl -n {NAMESPACE} apply -f examples/" in text
    assert "port-forward svc/rockbot-AGENT 8080:8080" in text


def test_notes_warn_when_agents_cannot_reach_any_llm(notes: Callable[[dict], str]) -> None:
    assert "agents.egress.llmCIDRs is empty" in notes({})
    assert "agents.egress.llmCIDRs is empty" not in notes(COMBINATIONS["agent-namespaces"])


def test_notes_give_the_openrouter_mcp_url_when_enabled(notes: Callable[[dict], str]) -> None:
    url = f"http://rockbot-openrouter-mcp.{NAMESPACE}.svc:8080/mcp"
    assert url in notes(COMBINATIONS["openrouter-mcp"])
    assert url not in notes({})


def test_notes_say_how_to_create_the_openrouter_secret_named_in_values(notes: Callable[[dict], str]) -> None:
    values = {"openrouterMcp": {"enabled": True, "apiKeySecret": {"name": "or-key", "key": "token"}}}
    text = notes(values)
    assert f"kubectl -n {NAMESPACE} create secret generic or-key \\\n" in text
    assert '--from-literal=token="$OPENROUTER_API_KEY"' in text
    assert "OPENROUTER_API_KEY" not in notes({})


def test_notes_give_the_webhook_address_and_how_to_open_it_to_senders_outside(notes: Callable[[dict], str]) -> None:
    inside = notes({})
    assert f"http://rockbot-gateway.{NAMESPACE}.svc:80/hooks/NAMESPACE/TRIGGER" in inside
    assert "gateway.ingress.enabled=true" in inside
    exposed = notes(COMBINATIONS["gateway-exposed"])
    assert "https://hooks.example.com/hooks/NAMESPACE/TRIGGER" in exposed and "gateway.ingress.enabled" not in exposed
    assert "Triggers" not in notes(COMBINATIONS["gateway-off"])
