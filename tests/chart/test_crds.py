"""The chart installs exactly the CRDs generated at the top of the repository."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from tests.chart.conftest import CHART, REPO, Manifest

SYNC = "cp crds/*.yaml charts/rockbot/crds/"


def test_chart_crds_are_byte_identical_to_the_top_level_crds() -> None:
    top = {path.name: path.read_bytes() for path in (REPO / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert top, "crds/ is empty: generate the CRDs with `rockbot crds --write`"
    assert sorted(chart) == sorted(top), f"the chart's CRD files differ from crds/: run `{SYNC}` (and remove extras)"
    stale = [name for name in top if chart[name] != top[name]]
    assert not stale, f"charts/rockbot/crds/ is stale for {stale}: run `{SYNC}`"


def test_rendered_chart_includes_every_crd(render: Callable[..., list[Manifest]]) -> None:
    expected = {yaml.safe_load(path.read_text())["metadata"]["name"] for path in (REPO / "crds").glob("*.yaml")}
    rendered = {m["metadata"]["name"] for m in render() if m["kind"] == "CustomResourceDefinition"}
    assert rendered == expected
    assert {"agents.rockbot.dev", "tools.rockbot.dev", "scheduledtasks.rockbot.dev"} <= rendered
