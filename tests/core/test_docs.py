"""The documentation site builds without a broken link, and its generated reference matches the code."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from rockbot import docgen

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", sorted(docgen.render_all(ROOT)))
def test_generated_reference_page_is_current(page: str) -> None:
    committed = (ROOT / docgen.REFERENCE / page).read_text()
    assert committed == docgen.render_all(ROOT)[page], f"docs/reference/{page} is stale: run `rockbot docs --write`"


def test_site_builds_strictly(tmp_path: pathlib.Path) -> None:
    """`mkdocs build --strict`: a broken link or anchor, a missing snippet or a page left out of the nav fails."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "resources" / "index.html").exists()


def test_values_reference_documents_every_leaf_the_chart_comments() -> None:
    """The values page's parser reads values.yaml's `# --` comments: a key it misses would vanish from the page."""
    text = (ROOT / docgen.VALUES).read_text()
    commented = sum(1 for line in text.splitlines() if line.strip().startswith("# --"))
    assert len(list(docgen._values_rows(text))) == commented


def test_every_spec_field_has_a_description() -> None:
    """The CRDs carry each field's description, so `kubectl explain agent.spec.scriptLimits` answers too."""
    from rockbot import crdgen

    undescribed = []
    for resource in crdgen.RESOURCES:
        spec = crdgen.crd_for(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        undescribed += [f"{resource.kind} {path}" for path, field, _ in docgen._fields(spec, "spec")
                        if not field.get("description")]
    assert undescribed == [], "describe these fields in rockbot/resources (Field(description=...))"
